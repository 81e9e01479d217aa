"""What ``zero_auto`` tries and how it chooses: pure functions of the plan and of measured trial steps.

Candidates come from the plan's DeepSpeed rows that fit the budget, and on one device from its one-card rows
(:func:`onecard_candidates`). With a fixed global batch each candidate
gets the largest micro-batch that divides the per-device batch and fits, and the accumulation that keeps the
global batch; with ``batch_size: max`` it gets the largest micro-batch that fits. Offload candidates use pinned
host buffers on CUDA. What did not fit (the plan was optimistic) is tried again at a smaller micro-batch
(:func:`retries`); a trial whose peak leaves less of the budget free than :data:`TRIAL_MARGIN` does not count as
fitting (:func:`judge`).
The approximate levers (:data:`APPROXIMATE_LEVERS`) are tried only when asked (:func:`approximate_levers`): each
offload candidate is then followed by its variants with each lever that applies (:func:`with_levers`), beyond
``max_trials``. :func:`choose` takes the highest samples/s among the trials that fitted, ties going to the earlier
candidate, so the same measurements always give the same choice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

from lightning_zero.auto.plan import PlanRow
from lightning_zero.errors import ZeroConfigError
from lightning_zero.memory.states import Layout
from lightning_zero.strategies.deepspeed_config import REDUCE_BUCKET

MAX = "max"
#: bf16 master weights, gradients and Adam states of the offloaded optimizer (``bf16_optimizer_states``).
BF16_STATES = "bf16_optimizer_states"
#: DeepSpeed's ZenFlow: the most important gradient columns every step, the rest delayed (``zenflow``).
ZENFLOW = "zenflow"
#: The levers that change the training's result, not only its speed; a :class:`Candidate` takes one at most.
APPROXIMATE_LEVERS = (BF16_STATES, ZENFLOW)
#: How the trials' table and candidate names mark an approximate lever.
LEVER_TAGS = {BF16_STATES: "~bf16-states", ZENFLOW: "~zenflow"}
#: Buckets are whole multiples of this many elements: no larger than the model (less buffer memory), and even.
BUCKET_GRANULE = 2**20
#: Share of the budget a trial's peak allocated memory must leave free, for what the run adds to it (its loop and
#: batches) and the allocator's page rounding.
TRIAL_MARGIN = 0.02
#: A trial over that margin is tried again at most this share of its micro-batch.
RETRY_STEP = 0.9


@dataclass(frozen=True)
class Candidate:
    """One configuration to try: a layout, micro-batch x accumulation, pinned host buffers, bucket size, and an
    approximate lever of :data:`APPROXIMATE_LEVERS` (``""``: none, exact Adam)."""

    layout: Layout
    micro_batch: int
    accumulation: int
    pin_memory: bool
    bucket_size: int
    lever: str = ""

    @property
    def approximate(self) -> bool:
        return bool(self.lever) or self.layout.approximate

    @property
    def name(self) -> str:
        pinned = " pinned" if self.pin_memory else ""
        tag = f" {LEVER_TAGS[self.lever]}" if self.lever else " ~" if self.layout.approximate else ""
        return f"{self.layout.name} {self.micro_batch}x{self.accumulation}{pinned}{tag}"


@dataclass(frozen=True)
class Measurement:
    """What a trial of a candidate gave: whether it fitted, its samples/s, its peak, and why it did not fit.

    ``peak_bytes`` is the largest device memory the process allocated during the trial, on the rank that allocated
    the most (what the earlier trials left allocated included; 0 where not measured);
    ``samples_per_sec`` is set when the steps ran, even if the trial then did not count as fitting;
    ``retry_at`` is the micro-batch to try again at when it did not fit (0: half of it).
    """

    candidate: Candidate
    fits: bool
    samples_per_sec: float = 0.0
    peak_bytes: int = 0
    reason: str = ""
    retry_at: int = 0


def largest_divisor_at_most(value: int, limit: int) -> int:
    """The largest divisor of ``value`` not above ``limit`` (0 when ``limit`` < 1)."""
    return max((d for d in range(1, min(value, limit) + 1) if value % d == 0), default=0)


def _prior(row: PlanRow, micro: int) -> tuple[int, int, int, int]:
    """Order of trial: no offload first, then larger micro-batches, no checkpointing, stage 2 before 1 and 3."""
    layout = row.layout
    offload = int(layout.offload_optimizer) + int(layout.offload_parameters) + int(layout.offload_ratio < 1.0)
    return (offload, -micro, int(layout.activation_checkpointing), {2: 0, 1: 1, 3: 2}.get(layout.stage, 3))


def approximate_levers(approximate: bool, precision: str, cpu_adam_for_offload: bool, on_cuda: bool) -> tuple[str, ...]:
    """The approximate levers a search may try: none unless ``approximate``; both need DeepSpeed's CPU Adam under
    offload (``cpu_adam_for_offload``), bf16 optimizer states a bf16 ``precision``, and ZenFlow CUDA: on CPU,
    DeepSpeed 0.19.8's ZenFlow changes the model's 2-D weights as it sets up, and its losses turn NaN."""
    if not (approximate and cpu_adam_for_offload):
        return ()
    wanted = {BF16_STATES: precision.startswith("bf16"), ZENFLOW: on_cuda}
    return tuple(lever for lever in APPROXIMATE_LEVERS if wanted[lever])


def lever_applies(lever: str, candidate: Candidate) -> bool:
    """Whether ``lever`` can run on ``candidate``: both need the optimizer offloaded; ZenFlow runs at stages 1-2
    (DeepSpeed 0.19.8's stage-3 ZenFlow allocates on ``"cuda"`` by name) and takes over DeepSpeed's gradient
    accumulation for its delayed updates, so only without accumulation."""
    layout = candidate.layout
    if not layout.offload_optimizer:
        return False
    if lever == ZENFLOW:
        return layout.stage in (1, 2) and candidate.accumulation == 1
    return lever == BF16_STATES


def with_levers(found: Sequence[Candidate], levers: Sequence[str]) -> list[Candidate]:
    """``found`` in order, each exact candidate followed by its variants with each of ``levers`` that applies."""
    ordered: list[Candidate] = []
    for candidate in found:
        ordered.append(candidate)
        ordered.extend(replace(candidate, lever=lever) for lever in levers if lever_applies(lever, candidate))
    return ordered


def _micro_and_accumulation(row: PlanRow, world_size: int, global_batch: int | str) -> tuple[int, int]:
    """The largest micro-batch of ``row`` that keeps ``global_batch`` (``(0, 0)``: none), and its accumulation."""
    if global_batch == MAX:
        return row.max_micro_batch, 1
    assert isinstance(global_batch, int)
    per_device = global_batch // world_size
    micro = largest_divisor_at_most(per_device, row.max_micro_batch)
    return (micro, per_device // micro) if micro else (0, 0)


def candidates(
    rows: Sequence[PlanRow],
    world_size: int,
    global_batch: int | str,
    total_parameters: int,
    on_cuda: bool,
    max_trials: int,
    default_bucket: int = REDUCE_BUCKET,
    host_free_bytes: int | None = None,
    levers: Sequence[str] = (),
    onecard: OneCardRules | None = None,
) -> list[Candidate]:
    """The first ``max_trials`` DeepSpeed candidates that the plan says fit, in trial order, each followed by its
    variants with the approximate ``levers`` that apply (:func:`with_levers`); with ``onecard`` (one device), the
    one-card candidates first (:func:`onecard_candidates`), beyond ``max_trials``.

    With ``host_free_bytes``, layouts whose host memory (DeepSpeed's estimate where it has one) exceeds it are
    left out: a trial that exhausts host memory is ended by the system, not by an error.
    """
    bucket = min(default_bucket, -(-max(1, total_parameters) // BUCKET_GRANULE) * BUCKET_GRANULE)
    usable = [
        row
        for row in rows
        if row.max_micro_batch >= 1 and (host_free_bytes is None or row.states.host_bytes <= host_free_bytes)
    ]
    scored = []
    for row in usable:
        if row.layout.backend != "deepspeed":
            continue
        micro, accumulation = _micro_and_accumulation(row, world_size, global_batch)
        if micro == 0:
            continue
        pin = on_cuda and row.layout.offload_optimizer
        scored.append((_prior(row, micro), Candidate(row.layout, micro, accumulation, pin, bucket)))
    scored.sort(key=lambda item: item[0])
    found = with_levers([candidate for _, candidate in scored[:max_trials]], levers)
    if onecard is None or world_size != 1:
        return found
    return onecard_candidates(usable, global_batch, onecard, bucket) + found


@dataclass(frozen=True)
class OneCardRules:
    """What the one-card candidates may use: the optimizer offload (torchao's ``CPUOffloadOptimizer``: CUDA
    only), the low-memory optimizers (``approximate``), and whether the run's precision allows them at all (fp16's
    loss scaling needs every gradient before any step)."""

    on_cuda: bool
    approximate: bool
    precision: str

    def allow(self, layout: Layout) -> bool:
        if layout.backend != "onecard" or self.precision.startswith("16"):
            return False
        if layout.offload_optimizer and not self.on_cuda:
            return False
        return self.approximate or not layout.approximate


def onecard_candidates(
    rows: Sequence[PlanRow], global_batch: int | str, rules: OneCardRules, bucket: int
) -> list[Candidate]:
    """For each one-card lever set the rules allow, its least memory-saving variant (plain, then activation
    checkpointing, then checkpointing and activation offload) that fits the whole batch of a step in one
    micro-batch: the levers step each gradient as it completes, so nothing accumulates."""
    chosen: dict[Layout, Candidate] = {}
    for row in rows:
        layout = row.layout
        micro, accumulation = _micro_and_accumulation(row, 1, global_batch)
        if not rules.allow(layout) or micro == 0 or accumulation != 1:
            continue
        bare = replace(layout, activation_checkpointing=False, activation_offload=False)
        if bare not in chosen:
            chosen[bare] = Candidate(layout, micro, 1, False, bucket)
    return sorted(chosen.values(), key=lambda c: (int(c.layout.offload_optimizer), int(c.approximate)))


def needless(candidate: Candidate, measurements: Sequence[Measurement]) -> bool:
    """Whether a trial of ``candidate`` can be left out: it offloads the parameters while a candidate that keeps
    them on the device has fitted already (parameter offload only adds host-device traffic, and needs the most
    host memory of all layouts)."""
    return candidate.layout.offload_parameters and any(
        m.fits and not m.candidate.layout.offload_parameters for m in measurements
    )


def smaller(measurement: Measurement, keep_global_batch: bool) -> Candidate | None:
    """A trial that did not fit, at a smaller micro-batch: its ``retry_at``, else half (``None``: none smaller).

    To keep a set global batch, the micro-batch is the largest divisor of the samples per step at most that,
    and accumulation makes up the rest; with ``batch_size: max`` accumulation stays 1. ``None`` too where the
    candidate's lever would not apply at the smaller micro-batch (ZenFlow with accumulation).
    """
    if measurement.fits:
        return None
    candidate = measurement.candidate
    if candidate.layout.backend == "onecard" and keep_global_batch:
        return None  # its levers do not accumulate: no smaller micro-batch keeps the global batch
    target = min(measurement.retry_at or candidate.micro_batch // 2, candidate.micro_batch - 1)
    per_step = candidate.micro_batch * candidate.accumulation
    micro = largest_divisor_at_most(per_step, target) if keep_global_batch else target
    if micro < 1:
        return None
    retried = replace(candidate, micro_batch=micro, accumulation=per_step // micro if keep_global_batch else 1)
    return None if retried.lever and not lever_applies(retried.lever, retried) else retried


def retries(trials: Sequence[Measurement], latest: Sequence[Measurement], keep_global_batch: bool) -> list[Candidate]:
    """What of the ``latest`` trials to try again at a smaller micro-batch (:func:`smaller`), given all ``trials``.

    With a set global batch: what did not fit, while nothing has fitted. With ``batch_size: max``: what did not
    fit and could still beat what fitted. That is a trial that ran (but left too little of the budget free) and
    ran faster than anything that fitted, or one that ran out of memory whose smaller micro-batch is still larger
    than anything that fitted (under offload the CPU optimizer step costs the same at any batch, so the larger
    micro-batch is the likely winner).
    """
    fitted = [m for m in trials if m.fits]
    if keep_global_batch and fitted:
        return []
    largest = max((m.candidate.micro_batch for m in fitted), default=0)
    fastest = max((m.samples_per_sec for m in fitted), default=0.0)
    again = []
    for measurement in latest:
        retried = smaller(measurement, keep_global_batch)
        if retried is None:
            continue
        if measurement.samples_per_sec > 0:
            could_win = measurement.samples_per_sec > fastest
        else:
            could_win = retried.micro_batch > largest
        if could_win:
            again.append(retried)
    return again


def judge(
    candidate: Candidate, ran: bool, reason: str, peak_bytes: int, budget_bytes: float, samples_per_sec: float
) -> Measurement:
    """What a trial's steps say of ``candidate``: it fits when they ran and their peak left :data:`TRIAL_MARGIN` of
    the budget free; one that ran over that margin is to be tried again at a micro-batch that scales its peak into
    it (at most :data:`RETRY_STEP` of it), and keeps its samples/s for :func:`retries` to compare."""
    safe = budget_bytes * (1 - TRIAL_MARGIN)
    fits, retry_at = ran, 0
    if ran and peak_bytes > safe:
        fits, reason = False, f"peak {peak_bytes / 2**30:.1f} GiB, over {1 - TRIAL_MARGIN:.0%} of the budget"
        retry_at = int(candidate.micro_batch * min(RETRY_STEP, safe / peak_bytes))
    rate = samples_per_sec if fits or retry_at else 0.0
    return Measurement(candidate, fits, rate, peak_bytes, "" if fits else reason or "did not fit", retry_at)


def choose(measurements: Sequence[Measurement]) -> Measurement:
    """The fitted measurement with the highest samples/s (the earliest on ties)."""
    best: Measurement | None = None
    for measurement in measurements:
        if measurement.fits and (best is None or measurement.samples_per_sec > best.samples_per_sec):
            best = measurement
    if best is None:
        tried = "; ".join(f"{m.candidate.name}: {m.reason}" for m in measurements) or "nothing fitted in the plan"
        raise ZeroConfigError(
            f"zero_auto found no configuration that fits the memory budget ({tried}): raise `memory_budget_gib`,"
            " add devices, or lower the batch size."
        )
    return best


def trial_result(measurement: Measurement) -> str:
    """What one trial gave: its samples/s or why it did not fit, and its peak."""
    m = measurement
    result = f"{m.samples_per_sec:8.2f} samples/s" if m.fits else f"no: {m.reason}"
    return result + (f"  (peak {m.peak_bytes / 2**30:.1f} GiB)" if m.peak_bytes else "")


def format_trials(measurements: Sequence[Measurement], chosen: Measurement) -> str:
    """A short table of what was tried, what it gave, and which was chosen; approximate rows are tagged ``~``."""
    lines = ["zero_auto trials (highest samples/s that fits wins):"]
    for m in measurements:
        mark = "->" if m is chosen else "  "
        lines.append(f"{mark} {m.candidate.name:<40} {trial_result(m)}")
    if any(m.candidate.approximate for m in measurements):
        lines.append("~ approximate: not exact Adam, accuracy not measured here (docs/auto-fit.md)")
    return "\n".join(lines)


def candidate_to_dict(candidate: Candidate) -> dict[str, object]:
    """A JSON-ready form of a candidate (for the cache file)."""
    return asdict(candidate)


def candidate_from_dict(values: dict[str, object]) -> Candidate:
    """The candidate :func:`candidate_to_dict` wrote."""
    layout = values["layout"]
    assert isinstance(layout, dict)
    fields = {key: value for key, value in values.items() if key != "layout"}
    return Candidate(layout=Layout(**layout), **fields)  # type: ignore[arg-type]
