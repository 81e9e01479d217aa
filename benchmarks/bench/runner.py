"""The parent of every trial: starts one process per rank, watches their progress files, and builds each row.

A row is searched (one or more processes, each ascending from one micro-batch to the first OOM) and then
measured at the largest batch that fitted on every rank (one more process). Each finished row is appended to
``results.jsonl`` in the output folder at once, so a run that is cut off keeps everything finished, and the
same command run again skips what is there. The run stops starting rows when its time budget is nearly spent.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from benchmarks.bench.catalogue import Experiment, Row, StrategySpec, find_experiment
from benchmarks.bench.search import Bracket, SearchPolicy, bracket

REPRODUCE = Path(__file__).resolve().parents[1] / "reproduce.py"
REPO = REPRODUCE.parents[1]
RESULTS_FILE = "results.jsonl"
GRACE_S = 3.0


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """What every trial of a run shares.

    Args:
        out: Output folder (results, table, CSV).
        trials_dir: Where each trial's spec, logs and progress files go (``out/trials`` if ``None``).
        accelerator: ``gpu`` or ``cpu``.
        devices: Processes (GPUs) per trial.
        memory_cap_gib: Per-process memory cap (the emulated card); 0: none.
        precision: The Trainer's precision.
        steps: Timed (non-skipped) steps wanted per measurement.
        min_steps: Timed steps taken at least, even past ``measure_budget_s``.
        warmup: Untimed steps before them.
        measure_budget_s: Seconds of timed steps after which a measurement stops once it has ``min_steps``.
        profile_steps: Extra steps with a sync between forward, backward and optimizer step.
        tolerance: Batch-search resolution (fraction).
        search_budget_s: Seconds one search process may ascend.
        budget_s: Seconds this whole run may take; no row is started with less than ``row_reserve_s`` left
            (``offload_reserve_s`` for rows that offload, whose steps take seconds).
        row_reserve_s: See ``budget_s``.
        offload_reserve_s: See ``budget_s``.
        threads: Intra-op threads per process (0: torch's default).
        emulated_memory: Per rank, ``(base, per_sample)`` bytes of an emulated memory under the cap (CPU tests).
    """

    out: Path
    trials_dir: Path | None = None
    accelerator: str = "gpu"
    devices: int = 1
    memory_cap_gib: float = 24.0
    precision: str = "16-mixed"
    steps: int = 50
    min_steps: int = 10
    warmup: int = 5
    measure_budget_s: float = 45.0
    profile_steps: int = 3
    tolerance: float = 0.06
    search_budget_s: float = 150.0
    budget_s: float = 520.0
    row_reserve_s: float = 40.0
    offload_reserve_s: float = 150.0
    threads: int = 0
    emulated_memory: tuple[tuple[float, float], ...] = ()


@dataclasses.dataclass
class TrialOutcome:
    """What the ranks of one trial process wrote, and how it ended.

    ``peak_host_bytes`` is the largest resident memory of all ranks' process trees, sampled at every poll;
    ``killed``: a rank ended on SIGKILL before the harness ended the trial.
    """

    records: list[list[dict[str, Any]]]
    exit_codes: list[int | None]
    timed_out: bool
    seconds: float
    peak_host_bytes: int = 0
    killed: bool = False

    def events(self, name: str) -> list[dict[str, Any]]:
        return [record for rank in self.records for record in rank if record.get("event") == name]

    def ok_batches(self) -> list[int]:
        """Batches every rank finished a stage of."""
        per_rank = [{r["batch"] for r in rank if r.get("event") == "ok"} for rank in self.records]
        return sorted(set.intersection(*per_rank)) if per_rank else []

    def error(self) -> str | None:
        """Why the trial failed, other than by running out of memory (``None`` if it did not).

        An OOM on one rank makes the others fail in their next collective: those errors are not the cause.
        """
        if self.events("oom"):
            return None
        errors = self.events("error")
        if errors:
            return str(errors[0].get("error", "error"))[-1500:]
        if self.timed_out:
            return "timed out"
        if any(code not in (0, None) for code in self.exit_codes):
            killed = " (killed by SIGKILL: host out of memory?)" if self.killed else ""
            return f"exit codes {self.exit_codes}{killed}"
        return None


class Clock:
    """The run's deadline."""

    def __init__(self, budget_s: float) -> None:
        self.deadline = time.monotonic() + budget_s

    def left(self) -> float:
        return self.deadline - time.monotonic()


def tree_rss(pids: list[int]) -> int:
    """Resident memory of the processes ``pids`` and all their descendants now, in bytes (shared pages counted
    once per process)."""
    total = 0
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            root = psutil.Process(pid)
            for process in (root, *root.children(recursive=True)):
                with contextlib.suppress(psutil.NoSuchProcess):
                    total += process.memory_info().rss
    return total


def needs_rendezvous(settings: RunSettings, fits: list[dict[str, Any]]) -> bool:
    """Whether the ranks get the rendezvous variables (``RANK``, ``MASTER_ADDR``, ...): on several devices, and for
    Accelerate rows, which ``accelerate launch`` would start with them even for one process."""
    kinds = {find_experiment(fit["experiment"]).strategy(fit["strategy"]).kind for fit in fits}
    return settings.devices > 1 or "accelerate" in kinds


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def child_environment() -> dict[str, str]:
    """The environment of a child process: this one's, with the repository importable and output unbuffered."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    return env


def start_cpu_adam_build(log: Path) -> subprocess.Popen[bytes]:
    """Build DeepSpeed's CPU Adam through lightning-zero's ``build_op`` (which clears a lock a long-killed build
    left), in a session of its own, its output in ``log``."""
    from lightning_zero.runtime.ops import start_build

    return start_build(
        "CPUAdamBuilder", cwd=REPO, env=child_environment(), stdout=log.open("w"), stderr=subprocess.STDOUT
    )


def wait_for_build(process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Let a build end before the run does: one killed midway leaves torch's build lock behind, and the next
    build waits on it (a later run on the same machine stalled in its first offload trial)."""
    if process.poll() is None:
        print("waiting for DeepSpeed's CPU Adam build to end", flush=True)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill(process)
            process.wait()


def _kill(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def _read_records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by a kill
            continue
    return records


def _finished(records: list[dict[str, Any]]) -> bool:
    return any(r.get("event") in ("oom", "error", "exit") for r in records)


def run_trial(settings: RunSettings, name: str, fits: list[dict[str, Any]], timeout_s: float) -> TrialOutcome:
    """Run ``fits`` in one process per rank; kill every rank once one ends badly or the time is up."""
    folder = (settings.trials_dir or settings.out / "trials") / name
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("rank*"):
        stale.unlink()
    spec = {
        "fits": fits,
        "progress_dir": str(folder),
        "accelerator": settings.accelerator,
        "devices": settings.devices,
        "precision": settings.precision,
        "memory_cap_gib": settings.memory_cap_gib,
        "threads": settings.threads,
        "emulated_memory": [list(pair) for pair in settings.emulated_memory],
    }
    spec_path = folder / "spec.json"
    spec_path.write_text(json.dumps(spec, indent=1))
    port = _free_port()
    rendezvous = needs_rendezvous(settings, fits)
    processes = []
    for rank in range(settings.devices):
        env = child_environment()
        if rendezvous:
            env.update(
                RANK=str(rank),
                LOCAL_RANK=str(rank),
                WORLD_SIZE=str(settings.devices),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
            )
        log = (folder / f"rank{rank}.log").open("w")
        command = [sys.executable, str(REPRODUCE), "trial", str(spec_path)]
        processes.append(
            subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        )
    start = time.monotonic()
    ended_at: float | None = None
    timed_out = False
    peak_host = 0
    codes: list[int | None] = []
    try:
        while True:
            time.sleep(0.25)
            peak_host = max(peak_host, tree_rss([p.pid for p in processes]))
            records = [_read_records(folder / f"rank{rank}.jsonl") for rank in range(settings.devices)]
            codes = [p.poll() for p in processes]
            if all(code is not None for code in codes):
                break
            if ended_at is None and (any(_finished(r) for r in records) or any(c not in (None, 0) for c in codes)):
                ended_at = time.monotonic()
            if ended_at is not None and time.monotonic() - ended_at > GRACE_S:
                break
            if time.monotonic() - start > timeout_s:
                timed_out = True
                break
    finally:
        for process in processes:
            _kill(process)
        for process in processes:
            process.wait()
    records = [_read_records(folder / f"rank{rank}.jsonl") for rank in range(settings.devices)]
    # a process that had ended on SIGKILL before the harness killed the rest: the kernel's OOM killer, most likely
    killed = -signal.SIGKILL in codes
    codes = [p.returncode for p in processes]
    return TrialOutcome(records, codes, timed_out, round(time.monotonic() - start, 1), peak_host, killed)


def row_precision(settings: RunSettings, row: Row) -> str:
    """The precision ``row`` trains in: its experiment's own, else the run's."""
    return find_experiment(row.experiment).precision or settings.precision


def _search_fit(settings: RunSettings, row: Row, policy: SearchPolicy) -> dict[str, Any]:
    return {
        "mode": "search",
        "experiment": row.experiment,
        "lengths": row.lengths,
        "strategy": row.strategy,
        "precision": row_precision(settings, row),
        "policy": dataclasses.asdict(policy),
    }


def measure_fit(settings: RunSettings, row: Row, batch: int, **extra: Any) -> dict[str, Any]:
    """A measurement fit of ``row`` at ``batch``."""
    return {
        "mode": "measure",
        "experiment": row.experiment,
        "lengths": row.lengths,
        "strategy": row.strategy,
        "precision": row_precision(settings, row),
        "batch": batch,
        "warmup": settings.warmup,
        "steps": settings.steps,
        "min_steps": settings.min_steps,
        "budget_s": settings.measure_budget_s,
        "profile_steps": settings.profile_steps,
        **extra,
    }


@dataclasses.dataclass
class SearchResult:
    bracket: Bracket
    trials: list[dict[str, Any]]
    error: str | None
    seconds: float
    session: dict[str, Any]


def search_row(settings: RunSettings, row: Row, experiment: Experiment, clock: Clock) -> SearchResult:
    """Processes ascending in micro-batch until the bracket is fine enough, the limit is hit, or time is up."""
    spec = experiment.strategy(row.strategy)
    ok: set[int] = set()
    failed: set[int] = set()
    history: list[tuple[int, int]] = []
    trials: list[dict[str, Any]] = []
    session: dict[str, Any] = {}
    start, limit = spec.start, experiment.max_batch
    seconds = 0.0
    for attempt in range(4):
        budget = min(settings.search_budget_s, clock.left() - settings.row_reserve_s / 2)
        if budget <= 10:
            break
        policy = SearchPolicy(start, limit, settings.tolerance, budget_s=budget, history=tuple(history))
        fits = [_search_fit(settings, row, policy)]
        outcome = run_trial(settings, f"{_slug(row)}-search{attempt}", fits, budget + 120)
        seconds += outcome.seconds
        session = session or _session(outcome)
        rank0 = outcome.records[0] if outcome.records else []
        trials.extend({k: r[k] for k in r if k != "t"} for r in rank0 if r.get("event") in ("ok", "oom"))
        good = outcome.ok_batches()
        ok.update(good)
        failed.update(int(r["batch"]) for r in outcome.events("oom") if r.get("batch"))
        history.extend((r["batch"], r["peak_reserved"]) for r in rank0 if r.get("event") == "ok")
        history.sort()
        error = outcome.error()
        if error is not None:
            return SearchResult(bracket(ok, failed), trials, error, seconds, session)
        found = bracket(ok, failed)
        done = any(r.get("reason") == "budget" for r in outcome.events("done"))
        if done or found.resolved(settings.tolerance, limit):
            return SearchResult(found, trials, None, seconds, session)
        limit = found.fails - 1 if found.fails else limit
        start = _refine_start(found)
    return SearchResult(bracket(ok, failed), trials, None, seconds, session)


def _refine_start(found: Bracket) -> int:
    """Where the next search process starts: the middle of the open bracket.

    Not the memory prediction: peaks are not affine in the batch near the cap (the optimizer step's transient
    buffers dominate small batches), and on the device a prediction clipped to the bracket's top walked down
    one batch per process.
    """
    return found.refine_start()


def _session(outcome: TrialOutcome) -> dict[str, Any]:
    for record in outcome.events("session"):
        return dict(record.get("session", {}))
    return {}


def _slug(row: Row) -> str:
    return row.key.replace("/", "__").replace("+", "-")


FRESH_STEP_DOWN = 0.9
FRESH_ATTEMPTS = 4
STARTUP_ESTIMATE_S = 45.0


@dataclasses.dataclass
class MeasureResult:
    """The measurement of a row, at the largest batch that fitted a fresh process, and the batches that did not."""

    measured: dict[str, Any] | None
    batch: int
    fresh_ooms: list[int]
    error: str | None
    seconds: float
    session: dict[str, Any] = dataclasses.field(default_factory=dict)


def measure_row(
    settings: RunSettings,
    row: Row,
    batch: int,
    clock: Clock,
    step_s: float,
    attempts: int = FRESH_ATTEMPTS,
    startup_s: float = STARTUP_ESTIMATE_S,
) -> MeasureResult:
    """Measure ``row`` at ``batch`` in a fresh process; lower it by 10% while a fresh process does not fit it.

    A fresh run allocates its gradients and optimizer state at the batch it trains, between activations, and
    needs more memory than the in-process search saw (seen on the device: 10-20% less batch). The largest batch
    measured is what a user's run fits. ``step_s`` (the search's last step time) sizes the time needed: a
    measurement that cannot finish in what is left of the run is not started. ``attempts`` 1: no lowering.
    """
    seconds, fresh_ooms = 0.0, list[int]()
    steps_needed = settings.warmup + settings.min_steps + settings.profile_steps
    for attempt in range(attempts):
        needed = startup_s + steps_needed * step_s
        if clock.left() < needed:
            error = f"not measured: {clock.left():.0f} s left of the run, about {needed:.0f} s needed"
            return MeasureResult(None, batch, fresh_ooms, error, seconds)
        # at least twice the estimate: a measurement takes its `min_steps` however long they take
        timeout = max(2 * needed, min(clock.left() - 5, startup_s + settings.measure_budget_s * 3 + 135))
        budget = max(5.0, min(settings.measure_budget_s, (clock.left() - needed) / 2 + settings.min_steps * step_s))
        fit = measure_fit(settings, row, batch, budget_s=budget)
        outcome = run_trial(settings, f"{_slug(row)}-measure{attempt}", [fit], timeout)
        seconds += outcome.seconds
        session = _session(outcome)
        measured = outcome.events("measured")
        if measured:
            record = {**measured[0], "peak_host_tree": outcome.peak_host_bytes}
            return MeasureResult(record, batch, fresh_ooms, None, seconds, session)
        if not outcome.events("oom") or batch <= 1:
            return MeasureResult(None, batch, fresh_ooms, outcome.error() or "no measurement", seconds, session)
        fresh_ooms.append(batch)
        batch = max(1, int(batch * FRESH_STEP_DOWN))
    return MeasureResult(None, batch, fresh_ooms, f"a fresh process ran out of memory at {fresh_ooms}", seconds)


#: Seconds a ``zero_auto`` row may spend choosing (plan probe, a few timed candidates) before it trains.
AUTO_STARTUP_S = 150.0
#: Step time assumed for a row measured without a search: offload and ``zero_auto`` rows take seconds a step.
FIXED_STEP_S = {True: 4.0, False: 1.0}


def run_fixed_row(settings: RunSettings, row: Row, spec: StrategySpec, clock: Clock) -> dict[str, Any]:
    """Measure a row at its strategy's set batch, with no search and no lowering (an OOM is the row's result)."""
    assert spec.batch is not None
    batch, auto = spec.batch, spec.loader_driven
    startup = STARTUP_ESTIMATE_S + (AUTO_STARTUP_S if auto else 0.0)
    step_s = FIXED_STEP_S[auto or spec.offloads]
    result = measure_row(settings, row, batch, clock, step_s, attempts=1, startup_s=startup)
    measured = result.measured or {}
    record: dict[str, Any] = {
        "fixed_batch": batch,
        "max_batch": int(measured.get("batch", 0)),
        "oom_batch": batch if result.fresh_ooms else None,
        "at_limit": False,
        "measure": result.measured,
        "measured_batch": measured.get("batch"),
        "measure_s": round(result.seconds, 1),
        "status": "ok" if result.measured else "oom" if result.fresh_ooms else "error",
        "session": result.session,
    }
    if result.error and not result.fresh_ooms:
        record["error"] = result.error
    return record


def load_results(*folders: Path) -> dict[str, dict[str, Any]]:
    """Rows by key from one or more results folders (the last record of each key wins)."""
    return {
        record["row"]: record
        for folder in folders
        for record in _read_records(folder / RESULTS_FILE)
        if "row" in record
    }


def finished(record: dict[str, Any]) -> bool:
    """Whether a row needs no rerun: measured, or out of memory at batch 1 (errors and time-outs are rerun)."""
    return record.get("status") in ("ok", "oom")


def append_result(out: Path, record: dict[str, Any]) -> None:
    with (out / RESULTS_FILE).open("a") as handle:
        handle.write(json.dumps(record) + "\n")


def run_row(
    settings: RunSettings, row: Row, clock: Clock, annotate: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """Search and measure one row; the record that goes into ``results.jsonl``."""
    experiment = find_experiment(row.experiment)
    started = time.time()
    record: dict[str, Any] = {
        "row": row.key,
        "experiment": row.experiment,
        "lengths": row.lengths,
        "strategy": row.strategy,
        "devices": settings.devices,
        "memory_cap_gib": settings.memory_cap_gib,
        "precision": row_precision(settings, row),
        "started": started,
    }
    spec = experiment.strategy(row.strategy)
    if spec.batch is not None:
        record.update(run_fixed_row(settings, row, spec, clock))
        annotate(record)
        return record
    search = search_row(settings, row, experiment, clock)
    record.update(
        max_batch=search.bracket.fits,
        oom_batch=search.bracket.fails,
        at_limit=search.bracket.fails is None and search.bracket.fits >= experiment.max_batch,
        search_trials=search.trials,
        search_s=round(search.seconds, 1),
        session=search.session,
    )
    if search.error:
        record.update(status="error", error=search.error)
    elif search.bracket.fits == 0:
        record["status"] = "oom"
    else:
        step_s = max((t.get("step_s", 0.0) for t in search.trials if t.get("event") == "ok"), default=1.0)
        result = measure_row(settings, row, search.bracket.fits, clock, step_s)
        record.update(
            measure=result.measured,
            measured_batch=result.batch,
            fresh_ooms=result.fresh_ooms,
            measure_s=round(result.seconds, 1),
            status="ok" if result.measured else "error",
        )
        if result.error:
            record["error"] = result.error
    annotate(record)
    return record
