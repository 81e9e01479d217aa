"""What the harness runs: the reports' experiments, the strategies compared on each, and the reports' numbers.

A row of the results table is one (experiment, lengths, strategy). Rows are listed in priority order: a run
that runs out of device time has measured the headline rows first, and a resumed run goes on from there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

Task = Literal["classification", "seq2seq", "causal"]
Kind = Literal["single", "lightning", "accelerate", "ours", "fairscale", "fsdp2", "auto"]
#: Rows of our own DeepSpeed strategies: they compute a causal LM's loss in chunks as ``CausalLMTask`` can (see
#: :attr:`Experiment.loss_chunk_tokens`). The others use the model's own loss, as their users would; so do our
#: FSDP2 rows, under which ``CausalLMTask`` refuses the chunked loss.
CHUNKED_LOSS_KINDS: tuple[Kind, ...] = ("ours", "auto")


@dataclasses.dataclass(frozen=True)
class Lengths:
    """How long the sequences of a batch are.

    Args:
        name: ``fixed`` (every sequence at its maximum) or a distribution of :mod:`benchmarks.bench.lengths`.
        source: Most tokens of a sequence (the encoder's, for seq2seq).
        target: Most decoder tokens (seq2seq only).
    """

    name: str
    source: int = 128
    target: int = 0

    @property
    def dynamic(self) -> bool:
        return self.name != "fixed"


@dataclasses.dataclass(frozen=True)
class StrategySpec:
    """One strategy as a user would configure it.

    Args:
        label: The row's name in the table.
        kind: Who provides it: plain single device/DDP, Lightning's built-in DeepSpeed, Hugging Face Accelerate's
            DeepSpeed (a plain PyTorch loop, no Lightning: :mod:`benchmarks.bench.accelerate_run`), ours,
            FairScale, FSDP2.
        strategy: The Trainer's strategy name (``auto`` for a plain single device, ``ddp`` on several); for
            Accelerate rows, which of our presets its DeepSpeed configuration corresponds to.
        zero: Overrides of one of our presets' fields.
        hf_checkpointing: Call Hugging Face's ``gradient_checkpointing_enable()`` in the module, by hand, as a
            Lightning user would with Lightning's own strategies.
        start: The first micro-batch the search tries.
        batch: Measure at this batch per device, without a search (``zero_auto`` rows: the dataloader's batch,
            which it keeps as the global batch unless ``zero`` says ``batch_size: max``).
    """

    label: str
    kind: Kind
    strategy: str
    zero: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    hf_checkpointing: bool = False
    start: int = 1
    batch: int | None = None

    @property
    def loader_driven(self) -> bool:
        """Whether the dataloader sets the micro-batch (``zero_auto`` chooses it) rather than the harness."""
        return self.kind == "auto"

    @property
    def offloads(self) -> bool:
        return "offload" in self.strategy or any(
            self.zero.get(key, "none") != "none" for key in ("offload_optimizer", "offload_parameters")
        )


@dataclasses.dataclass(frozen=True)
class ReportRow:
    """A number from the public reports: a per-GPU micro-batch (``None``: out of memory) and a time in seconds."""

    strategy: str
    batch: int | None
    seconds: float | None = None


@dataclasses.dataclass(frozen=True)
class Experiment:
    """One of the reports' experiments.

    Args:
        name: Short name used on the command line.
        shape: A :mod:`lightning_zero.app.models.shapes` name (random-initialised weights of the public config).
        task: What the model is trained to do.
        lengths: The length settings measured, in priority order.
        strategies: Every strategy compared, by label.
        anchor: Label of Lightning's built-in strategy that the report's ZeRO row corresponds to.
        report: The report's rows: its baseline first, then its ZeRO row (``None``: no report to reproduce).
        report_gpus: GPUs in the report's run.
        epoch_samples: Training examples in the report's data, for the epoch-time column (``None``: not stated).
        source: Where the report's numbers come from.
        max_batch: The search stops here (reported as "at least").
        vocab_size: Overrides the shape's vocabulary (the smoke test's tiny twins only).
        headline: Labels measured first (with the baseline and the anchor): our best configuration.
        precision: The workload's precision, whatever the run's ``--precision`` (``None``: the run's).
        loss_chunk_tokens: Our DeepSpeed rows of a causal LM compute its loss this many positions at a time, as
            ``CausalLMTask(loss_chunk_tokens=...)`` does (the Llama configs set it; ``None``: the model's own loss).
    """

    name: str
    shape: str
    task: Task
    lengths: tuple[Lengths, ...]
    strategies: tuple[StrategySpec, ...]
    anchor: str
    report: tuple[ReportRow, ReportRow] | None
    report_gpus: int
    epoch_samples: int | None
    source: str
    max_batch: int = 512
    vocab_size: int | None = None
    headline: tuple[str, ...] = ("lightning_ds2+hf_gc", "zero2+ac", "zero2_offload+ac+pin", "zero3_offload")
    precision: str | None = None
    loss_chunk_tokens: int | None = None

    def strategy(self, label: str) -> StrategySpec:
        """The strategy labelled ``label``: one of this experiment's rows, or of a same-config pair."""
        for spec in (*self.strategies, *(spec for pair in OVERHEAD_PAIRS for spec in pair)):
            if spec.label == label:
                return spec
        raise KeyError(f"experiment {self.name!r} has no strategy {label!r}: {[s.label for s in self.strategies]}")

    def length(self, name: str) -> Lengths:
        for lengths in self.lengths:
            if lengths.name == name:
                return lengths
        raise KeyError(f"experiment {self.name!r} has no lengths {name!r}: {[x.name for x in self.lengths]}")


@dataclasses.dataclass(frozen=True)
class Row:
    """One row of the table: an experiment at one length setting under one strategy."""

    experiment: str
    lengths: str
    strategy: str

    @property
    def key(self) -> str:
        return f"{self.experiment}/{self.lengths}/{self.strategy}"


_AC = {"activation_checkpointing": True}
#: Host buffers not page-locked: what our DeepSpeed offload presets did before pinning became their default, and
#: what Lightning's built-in strategies pass. The offload rows measured before then keep it, so they rerun as they ran.
_UNPINNED = {"pin_memory": False}
_PINNED = {"pin_memory": True}
SINGLE = StrategySpec("single", "single", "auto")
LIGHTNING_DS2 = StrategySpec("lightning_ds2", "lightning", "deepspeed_stage_2")
LIGHTNING_DS2_GC = StrategySpec("lightning_ds2+hf_gc", "lightning", "deepspeed_stage_2", hf_checkpointing=True, start=8)
ZERO2 = StrategySpec("zero2", "ours", "zero2")
ZERO2_AC = StrategySpec("zero2+ac", "ours", "zero2", _AC, start=8)
FAIRSCALE2 = StrategySpec("zero2_fairscale", "fairscale", "zero2_fairscale")
FSDP2_AC = StrategySpec("zero3_fsdp+ac", "fsdp2", "zero3_fsdp", _AC, start=8)
#: FSDP2 with parameters and optimizer step on the CPU: the FSDP2 row of the models that need offload on one card.
FSDP2_OFFLOAD_AC = StrategySpec("zero3_offload_fsdp+ac", "fsdp2", "zero3_offload_fsdp", _AC, start=8)
#: ``zero_auto`` with no flags at a global batch, and with ``batch_size: max``.
ZERO_AUTO_MAX = StrategySpec("zero_auto+max", "auto", "zero_auto", {"batch_size": "max"}, batch=1)
GPU_ONLY = (SINGLE, LIGHTNING_DS2, LIGHTNING_DS2_GC, ZERO2_AC, ZERO2, FAIRSCALE2, FSDP2_AC, ZERO_AUTO_MAX)
LIGHTNING_DS2_OFFLOAD = StrategySpec("lightning_ds2_offload", "lightning", "deepspeed_stage_2_offload", start=4)
#: The same-config pairs against Lightning (``--overhead``): our preset, and Lightning's built-in strategy run with
#: our preset's exact DeepSpeed config. They are measured apart from the table's rows, in any experiment.
LIGHTNING_PAIRS: tuple[tuple[StrategySpec, StrategySpec], ...] = (
    (ZERO2, LIGHTNING_DS2),
    (ZERO2_AC, LIGHTNING_DS2_GC),
    (StrategySpec("zero3", "ours", "zero3"), StrategySpec("lightning_ds3", "lightning", "deepspeed_stage_3")),
    (StrategySpec("zero2_offload", "ours", "zero2_offload"), LIGHTNING_DS2_OFFLOAD),
)


def at_batch(spec: StrategySpec, batch: int) -> StrategySpec:
    """``spec`` measured at ``batch``, without a search: a row whose search found its batch but had no time left
    to time it."""
    return dataclasses.replace(spec, label=f"{spec.label}@{batch}", batch=batch)


def retimed(*rows: tuple[StrategySpec, int]) -> tuple[StrategySpec, ...]:
    """Searched rows again at the batch their fresh run trained: the rows whose search left time for fewer than
    50 timed steps, to be timed over 50."""
    return tuple(at_batch(spec, batch) for spec, batch in rows)


def compile_pair(batch: int, preset: str = "zero2", checkpointing: bool = True) -> tuple[StrategySpec, StrategySpec]:
    """``preset`` (with checkpointing, unless told) at ``batch``, without and with ``compile_blocks``: the lever's
    effect alone."""
    kind: Kind = "fsdp2" if preset.endswith("_fsdp") else "ours"
    eager, label = (dict(_AC), f"{preset}+ac") if checkpointing else ({}, preset)
    return (
        StrategySpec(f"{label}@{batch}", kind, preset, eager, batch=batch),
        StrategySpec(f"{label}+compile@{batch}", kind, preset, {**eager, "compile_blocks": True}, batch=batch),
    )


LIGHTNING_DS3_OFFLOAD = StrategySpec("lightning_ds3_offload", "lightning", "deepspeed_stage_3_offload", start=8)
#: GPT-2 XL's DeepSpeed offload rows with activation checkpointing: the like-for-like partners of its FSDP2 row.
LIGHTNING_DS3_OFFLOAD_GC = StrategySpec(
    "lightning_ds3_offload+hf_gc", "lightning", "deepspeed_stage_3_offload", hf_checkpointing=True, start=16
)
ZERO3_OFFLOAD_AC = StrategySpec("zero3_offload+ac", "ours", "zero3_offload", {**_AC, **_UNPINNED}, start=16)
ZERO3_OFFLOAD_AC_PIN = StrategySpec("zero3_offload+ac+pin", "ours", "zero3_offload", {**_AC, **_PINNED}, start=16)
#: t5-3b's headline pair: the report's configuration through Lightning's built-in strategy and through ours.
LIGHTNING_DS2_OFFLOAD_GC = StrategySpec(
    "lightning_ds2_offload+hf_gc", "lightning", "deepspeed_stage_2_offload", hf_checkpointing=True, start=8
)
ZERO2_OFFLOAD_AC = StrategySpec("zero2_offload+ac", "ours", "zero2_offload", {**_AC, **_UNPINNED}, start=8)
#: The same with page-locked host buffers, the preset's default now.
ZERO2_OFFLOAD_AC_PIN = StrategySpec("zero2_offload+ac+pin", "ours", "zero2_offload", {**_AC, **_PINNED}, start=8)

#: GPT-2 XL's pinned ZeRO-2 offload with checkpointing, searched from 16.
GPT2_ZERO2_OFFLOAD_AC = StrategySpec("zero2_offload+ac", "ours", "zero2_offload", {**_AC, **_PINNED}, start=16)

#: Hugging Face Accelerate's DeepSpeed ZeRO-3 with parameters and optimizer on the CPU and Hugging Face gradient
#: checkpointing, configured as Accelerate's docs show: the anchor outside Lightning.
ACCELERATE_DS3_OFFLOAD_GC = StrategySpec(
    "accelerate_ds3_offload+hf_gc", "accelerate", "zero3_offload", hf_checkpointing=True, start=8
)
#: Accelerate's DeepSpeed with the plugin's own arguments alone (ZeRO stage, offload devices): what its user gets
#: with no config file, DeepSpeed's defaults for everything else.
ACCELERATE_DS2_OFFLOAD_DEFAULTS = StrategySpec(
    "accelerate_ds2_offload+defaults", "accelerate", "zero2_offload", {"plugin_defaults": True}, start=16
)
#: Ours with DeepSpeed's own ZeRO-2 communication defaults (no overlap below stage 3, 5e8-element buckets).
ZERO2_OFFLOAD_DS_DEFAULTS = StrategySpec(
    "zero2_offload+ds_defaults",
    "ours",
    "zero2_offload",
    {"overlap_comm": False, "reduce_bucket_size": 500_000_000, "allgather_bucket_size": 500_000_000},
    start=16,
)
#: The same-config pairs against Accelerate (``--overhead-pairs OURS~THEIRS``): Accelerate's DeepSpeed, in its plain
#: PyTorch loop, given our preset's exact DeepSpeed config; with checkpointing, Hugging Face's on its side.
ACCELERATE_PAIRS: tuple[tuple[StrategySpec, StrategySpec], ...] = (
    (
        StrategySpec("zero2_offload", "ours", "zero2_offload"),
        StrategySpec("accelerate_ds2_offload", "accelerate", "zero2_offload"),
    ),
    (
        ZERO2_OFFLOAD_AC_PIN,
        StrategySpec("accelerate_ds2_offload+hf_gc", "accelerate", "zero2_offload", hf_checkpointing=True),
    ),
    (ZERO3_OFFLOAD_AC_PIN, ACCELERATE_DS3_OFFLOAD_GC),
)
OVERHEAD_PAIRS = LIGHTNING_PAIRS + ACCELERATE_PAIRS
#: ``zero_auto`` also searching the approximate levers (bf16 optimizer states, ZenFlow), at its largest batch: the
#: approximate partner of ``zero_auto+max``.
ZERO_AUTO_APPROX = StrategySpec(
    "zero_auto+approx", "auto", "zero_auto", {"batch_size": "max", "approximate": True}, batch=1
)
#: The anchor rows of a model that needs offload on one card: Lightning's two DeepSpeed offload strategies and
#: Accelerate's, each with Hugging Face checkpointing (the best their users can do), against our FSDP2 offload and
#: ``zero_auto`` exact and approximate.
ANCHOR_LABELS = (
    LIGHTNING_DS2_OFFLOAD_GC.label,
    LIGHTNING_DS3_OFFLOAD_GC.label,
    ACCELERATE_DS3_OFFLOAD_GC.label,
    FSDP2_OFFLOAD_AC.label,
    ZERO_AUTO_MAX.label,
    ZERO_AUTO_APPROX.label,
)


def llama_experiment(name: str, start: int, ours_start: int, max_batch: int) -> Experiment:
    """A Llama 3 shape on packed 2048-token blocks in bf16-mixed: the anchors searched from ``start``, our FSDP2
    offload from ``ours_start``."""
    anchors = (LIGHTNING_DS2_OFFLOAD_GC, LIGHTNING_DS3_OFFLOAD_GC, ACCELERATE_DS3_OFFLOAD_GC)
    return Experiment(
        name=name,
        shape=name,
        task="causal",
        lengths=(Lengths("fixed", 2048),),
        strategies=(
            *(dataclasses.replace(spec, start=start) for spec in anchors),
            dataclasses.replace(FSDP2_OFFLOAD_AC, start=ours_start),
            ZERO_AUTO_MAX,
            ZERO_AUTO_APPROX,
        ),
        anchor=LIGHTNING_DS3_OFFLOAD_GC.label,
        report=None,
        report_gpus=1,
        epoch_samples=None,
        source="no report: torchtune's Llama-3.1-8B full fine-tune on one RTX 4090 (18.9 GiB, 1,650 tokens/s,"
        " compiled, packed 2048) is the published single-card figure",
        max_batch=max_batch,
        headline=ANCHOR_LABELS,
        precision="bf16-mixed",
        loss_chunk_tokens=1024,
    )


_MRPC = "Lightning's DeepSpeed/FairScale report (DeBERTa-v2-xlarge on MRPC, BlenderBot, GPT-2 XL), 2 GPUs"
_HF = "Hugging Face 'Fit More and Train Faster With ZeRO via DeepSpeed and FairScale' (t5-large 2 GPUs, t5-3b 1 GPU)"

EXPERIMENTS: tuple[Experiment, ...] = (
    Experiment(
        name="t5-3b",
        shape="t5-3b",
        task="seq2seq",
        lengths=(Lengths("fixed", 128, 128), Lengths("reviews", 128, 128)),
        strategies=(
            SINGLE,
            LIGHTNING_DS2_OFFLOAD_GC,
            ZERO2_OFFLOAD_AC,
            ZERO2_OFFLOAD_AC_PIN,
            LIGHTNING_DS2_OFFLOAD,
            StrategySpec("zero_auto@20", "auto", "zero_auto", batch=20),
            ZERO_AUTO_MAX,
            FAIRSCALE2,
            FSDP2_OFFLOAD_AC,
            at_batch(LIGHTNING_DS2_OFFLOAD_GC, 292),
            at_batch(ZERO2_OFFLOAD_AC, 292),
            at_batch(LIGHTNING_DS2_OFFLOAD_GC, 20),
            at_batch(ZERO2_OFFLOAD_AC_PIN, 20),
            at_batch(ZERO2_OFFLOAD_AC, 20),
            at_batch(ZERO2_OFFLOAD_AC_PIN, 292),
            *retimed(
                (LIGHTNING_DS2_OFFLOAD_GC, 512),
                (ZERO2_OFFLOAD_AC, 512),
                (ZERO2_OFFLOAD_AC_PIN, 512),
                (FSDP2_OFFLOAD_AC, 256),
                (LIGHTNING_DS2_OFFLOAD, 13),
                (LIGHTNING_DS2_OFFLOAD, 23),
            ),
            LIGHTNING_DS3_OFFLOAD_GC,
            ACCELERATE_DS3_OFFLOAD_GC,
            ZERO_AUTO_APPROX,
        ),
        anchor="lightning_ds2_offload+hf_gc",
        report=(ReportRow("plain", None), ReportRow("ZeRO-2 + CPU offload + activation checkpointing", 20, 8.85)),
        report_gpus=1,
        epoch_samples=60,
        source=_HF + ": --n_train 60, train time 8.85 s at batch 20",
    ),
    Experiment(
        name="gpt2-xl",
        shape="gpt2-xl",
        task="causal",
        lengths=(Lengths("fixed", 128),),
        strategies=(
            SINGLE,
            LIGHTNING_DS3_OFFLOAD,
            StrategySpec("zero3_offload", "ours", "zero3_offload", _UNPINNED, start=8),
            GPT2_ZERO2_OFFLOAD_AC,
            LIGHTNING_DS3_OFFLOAD_GC,
            StrategySpec("zero3_offload@16", "ours", "zero3_offload", _UNPINNED, batch=16),
            StrategySpec("zero2_offload@16", "ours", "zero2_offload", _UNPINNED, batch=16),
            StrategySpec("zero_auto@16", "auto", "zero_auto", batch=16),
            ZERO_AUTO_MAX,
            FAIRSCALE2,
            FSDP2_OFFLOAD_AC,
            at_batch(FSDP2_OFFLOAD_AC, 207),
            at_batch(LIGHTNING_DS3_OFFLOAD_GC, 207),
            at_batch(ZERO3_OFFLOAD_AC, 207),
            at_batch(ZERO3_OFFLOAD_AC_PIN, 207),
            at_batch(LIGHTNING_DS3_OFFLOAD_GC, 192),
            at_batch(ZERO3_OFFLOAD_AC_PIN, 192),
            *retimed((LIGHTNING_DS3_OFFLOAD, 33)),
            # zero_auto's choice with batch_size: max alone (calls 9, 10, 17: its trials fitted 197, its runs did not)
            at_batch(GPT2_ZERO2_OFFLOAD_AC, 197),
            at_batch(GPT2_ZERO2_OFFLOAD_AC, 177),
            dataclasses.replace(LIGHTNING_DS2_OFFLOAD_GC, start=16),
            dataclasses.replace(ACCELERATE_DS3_OFFLOAD_GC, start=16),
            ZERO_AUTO_APPROX,
            # the 1.38x of issue 41: Accelerate with no config file, ours pinned, ours with DeepSpeed's defaults
            at_batch(ACCELERATE_DS2_OFFLOAD_DEFAULTS, 16),
            StrategySpec("zero2_offload+pin@16", "ours", "zero2_offload", batch=16),
            at_batch(ZERO2_OFFLOAD_DS_DEFAULTS, 16),
        ),
        anchor="lightning_ds3_offload",
        report=(ReportRow("DDP", None), ReportRow("ZeRO-3 + CPU offload", 16)),
        report_gpus=2,
        epoch_samples=None,
        source=_MRPC,
        max_batch=256,
    ),
    Experiment(
        name="deberta",
        shape="deberta-v2-xlarge",
        task="classification",
        lengths=(Lengths("fixed", 128), Lengths("review-pairs", 128)),
        strategies=(
            *GPU_ONLY,
            *compile_pair(64),
            *compile_pair(128),
            *compile_pair(208),
            at_batch(FSDP2_AC, 64),
            at_batch(FSDP2_AC, 272),
            *compile_pair(16, "zero3_fsdp", checkpointing=False),
            *retimed((LIGHTNING_DS2_GC, 210), (ZERO2_AC, 324), (LIGHTNING_DS2_GC, 348)),
        ),
        anchor="lightning_ds2",
        report=(ReportRow("DDP", 8, 103.57), ReportRow("ZeRO-2", 40, 28.98)),
        report_gpus=2,
        epoch_samples=3668,
        source=_MRPC + "; MRPC has 3,668 training pairs",
    ),
    Experiment(
        name="blenderbot",
        shape="blenderbot-400M-distill",
        task="seq2seq",
        lengths=(Lengths("fixed", 128, 64), Lengths("chitchat", 128, 64)),
        strategies=(*GPU_ONLY, *compile_pair(256), *retimed((ZERO2_AC, 1024), (FSDP2_AC, 1024))),
        anchor="lightning_ds2",
        report=(ReportRow("DDP", 100, 27.36), ReportRow("ZeRO-2", 200, 19.06)),
        report_gpus=2,
        epoch_samples=None,
        source=_MRPC,
        max_batch=1024,
    ),
    Experiment(
        name="t5-large",
        shape="t5-large",
        task="seq2seq",
        lengths=(Lengths("fixed", 128, 128), Lengths("reviews", 128, 128)),
        strategies=(
            *GPU_ONLY,
            *compile_pair(64),
            at_batch(FSDP2_AC, 180),
            at_batch(FSDP2_AC, 350),
            *retimed(
                (LIGHTNING_DS2, 24),
                (LIGHTNING_DS2, 44),
                (LIGHTNING_DS2_GC, 315),
                (ZERO2_AC, 315),
                (LIGHTNING_DS2_GC, 512),
                (ZERO2_AC, 512),
            ),
        ),
        anchor="lightning_ds2",
        report=(ReportRow("DDP", 16, 30.95), ReportRow("DeepSpeed ZeRO-2", 40, 10.40)),
        report_gpus=2,
        epoch_samples=None,
        source=_HF,
    ),
    llama_experiment("llama-3.2-3b", start=2, ours_start=8, max_batch=128),
    llama_experiment("llama-3.1-8b", start=1, ours_start=4, max_batch=64),
)

#: Tiny twins for the CPU smoke test of the harness itself.
SMOKE_EXPERIMENTS: tuple[Experiment, ...] = (
    Experiment(
        name="tiny-gpt2",
        shape="tiny-gpt2",
        task="causal",
        lengths=(Lengths("fixed", 32),),
        strategies=(
            SINGLE,
            StrategySpec("zero2", "ours", "zero2"),
            StrategySpec("ddp", "single", "ddp"),
            StrategySpec("zero2@4", "ours", "zero2", batch=4),
            StrategySpec("zero_auto@4", "auto", "zero_auto", {"max_trials": 2, "trial_steps": 1}, batch=4),
            StrategySpec("zero_auto+max", "auto", "zero_auto", {"batch_size": "max", "max_trials": 1}, batch=1),
        ),
        anchor="zero2",
        report=(ReportRow("DDP", 4), ReportRow("ZeRO-2", 8)),
        report_gpus=2,
        epoch_samples=100,
        source="smoke test",
        max_batch=64,
        vocab_size=512,
    ),
    Experiment(
        name="tiny-llama",
        shape="tiny-llama",
        task="causal",
        lengths=(Lengths("fixed", 64),),
        strategies=(
            *(at_batch(spec, 2) for spec in (LIGHTNING_DS3_OFFLOAD_GC, ACCELERATE_DS3_OFFLOAD_GC, FSDP2_OFFLOAD_AC)),
            dataclasses.replace(ACCELERATE_DS3_OFFLOAD_GC, start=1),
            at_batch(ZERO3_OFFLOAD_AC, 2),
        ),
        anchor="lightning_ds3_offload+hf_gc@2",
        report=None,
        report_gpus=1,
        epoch_samples=None,
        source="smoke test",
        max_batch=64,
        vocab_size=512,
        loss_chunk_tokens=16,
    ),
    Experiment(
        name="tiny-t5",
        shape="tiny-t5",
        task="seq2seq",
        lengths=(Lengths("reviews", 64, 64),),
        strategies=(SINGLE,),
        anchor="single",
        report=(ReportRow("DDP", 4), ReportRow("ZeRO-2", 8)),
        report_gpus=1,
        epoch_samples=None,
        source="smoke test",
        max_batch=64,
        vocab_size=512,
    ),
)


def find_experiment(name: str) -> Experiment:
    """The experiment called ``name`` among the reports' and the smoke test's."""
    for experiment in (*EXPERIMENTS, *SMOKE_EXPERIMENTS):
        if experiment.name == name:
            return experiment
    names = [e.name for e in EXPERIMENTS]
    raise KeyError(f"unknown experiment {name!r}: choose from {names}")


def _tier(experiment: Experiment, lengths: Lengths, spec: StrategySpec) -> int:
    """0: the report's comparison (baseline, Lightning's anchor, our best); 1: dynamic lengths of those; 2: rest."""
    headline = spec.label in ("single", experiment.anchor, *experiment.headline)
    if headline and lengths is experiment.lengths[0]:
        return 0
    return 1 if headline else 2


def plan_rows(
    experiments: list[Experiment], strategies: list[str] | None = None, tier_first: bool = False
) -> list[Row]:
    """Every row of ``experiments`` (optionally only some strategy labels), headline rows first.

    Experiment by experiment, each one's headline first; with ``tier_first``, every experiment's headline rows
    before any other row.
    """
    rows: list[tuple[int, int, Row]] = []
    for order, experiment in enumerate(experiments):
        for lengths in experiment.lengths:
            for spec in experiment.strategies:
                if strategies and spec.label not in strategies:
                    continue
                tier = _tier(experiment, lengths, spec)
                rows.append((order, tier, Row(experiment.name, lengths.name, spec.label)))
    rows.sort(key=lambda item: (item[1], item[0]) if tier_first else (item[0], item[1]))
    return [row for _, _, row in rows]
