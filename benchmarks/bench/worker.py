"""One trial process (one rank of it): builds the model once and runs a batch-size search or a timed measurement.

The parent (:mod:`benchmarks.bench.runner`) starts one such process per rank with a JSON spec and reads what each
rank appends to its own progress file, one JSON record a line, flushed as it happens. An out-of-memory error
writes its record and ends the process at once (``os._exit``): after an OOM on one rank the others may wait in a
collective for ever, so the parent kills the whole trial; nothing here tries to recover.

Search: stages of increasing micro-batch, each one or two steps at the worst-case lengths, with the allocator's
cache emptied between stages; each stage's peak reserved memory (the maximum over ranks) predicts where the cap
is, so the search doubles while far from it and then closes in (:func:`benchmarks.bench.search.next_candidate`).
Measure: warm-up steps (the first at the worst-case lengths), then timed steps (a CUDA sync around each) until
enough non-skipped ones or the time budget, then a few profiled steps with syncs between forward, backward and
optimizer step.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import lightning as L
import torch

from benchmarks.bench.catalogue import find_experiment
from benchmarks.bench.controller import (
    EXIT_ERROR,
    EXIT_OOM,
    Controller,
    EmulatedMemory,
    RecordWriter,
    live_memory,
    reset_memory,
    sync,
)
from benchmarks.bench.search import SearchPolicy, next_candidate
from benchmarks.bench.workload import BenchModule, make_strategy, step_loader

MAX_STEPS = 1_000_000


@runtime_checkable
class StepSource(Protocol):
    """What a measurement reads from the module after each step (a :class:`BenchModule`, or the Accelerate loop's
    stand-in)."""

    last_batch: int
    last_facts: dict[str, int]


def own_peak_rss() -> int:
    """This process's resident-memory high-water mark in bytes, as the kernel counts it (Linux: KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class SkipCounter:
    """Counts optimizer steps skipped for fp16 overflow: DeepSpeed's own counter, or a falling GradScaler scale."""

    def __init__(self) -> None:
        self.skipped = 0
        self._scale: float | None = None

    def update(self, trainer: L.Trainer) -> int:
        engine = getattr(trainer.strategy, "deepspeed_engine", None)
        if engine is not None:
            self.skipped = int(engine.skipped_steps)
            return self.skipped
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        if scaler is not None:
            scale = float(scaler.get_scale())
            if self._scale is not None and scale < self._scale:
                self.skipped += 1
            self._scale = scale
        return self.skipped


class SearchController(Controller):
    """Stages of increasing micro-batch at the worst-case lengths; each stage's peak memory picks the next."""

    def __init__(
        self, writer: RecordWriter, fit_index: int, memory: EmulatedMemory | None, policy: SearchPolicy, cap_bytes: int
    ) -> None:
        super().__init__(writer, fit_index, memory)
        self.policy, self.cap_bytes = policy, cap_bytes
        self.batch = policy.start
        self.history: list[tuple[int, int]] = [tuple(pair) for pair in policy.history]  # type: ignore[misc]
        self.stage_steps = 0
        self.stage_start = 0.0
        self.first_stage = True
        self.started = time.perf_counter()

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if self.stage_steps == 0:
            reset_memory(self.device)
            if self.memory is not None:
                self.memory.reset()
            self.stage_start = time.perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self.stage_steps += 1
        if self.stage_steps < (2 if self.first_stage else 1):
            return
        sync(self.device)
        seconds = (time.perf_counter() - self.stage_start) / self.stage_steps
        allocated, reserved = self.peak_bytes()
        peaks = torch.tensor([allocated, reserved], dtype=torch.float64, device=self.device)
        allocated, reserved = (int(v) for v in trainer.strategy.reduce(peaks, reduce_op="max").tolist())
        self.record(event="ok", batch=self.batch, peak_allocated=allocated, peak_reserved=reserved, step_s=seconds)
        self.history.append((self.batch, reserved))
        self.first_stage, self.stage_steps = False, 0
        out_of_time = time.perf_counter() - self.started + seconds * 2 > self.policy.budget_s
        candidate = None if out_of_time else next_candidate(self.history, self.cap_bytes, self.policy)
        if candidate is None:
            self.record(event="done", reason="budget" if out_of_time else "limit")
            trainer.should_stop = True
        else:
            self.batch = candidate


def timing_done(timed: list[dict[str, Any]], elapsed_s: float, steps: int, min_steps: int, budget_s: float) -> bool:
    """Whether the timed steps so far are enough: ``steps`` good ones, or ``min_steps`` once ``budget_s`` has passed
    (however long they take). fp16 steps skipped on overflow do not count; once ``min_steps`` of them were skipped
    the measurement gives up (fp16 overflowing at every step)."""
    good = sum(not step["skipped"] for step in timed)
    skipped = len(timed) - good
    return good >= steps or (elapsed_s >= budget_s and good >= min_steps) or skipped >= min_steps


class MeasureController(Controller):
    """Warm-up, then timed steps at one micro-batch, then a few profiled steps.

    The first warm-up step runs the worst-case lengths: a fresh process must fit the longest batch of an epoch
    (what the search fitted), and ``torch.compile`` meets a second shape inside the warm-up, where its one
    recompilation for dynamic shapes belongs, rather than in a timed step.
    """

    def __init__(
        self,
        writer: RecordWriter,
        fit_index: int,
        memory: EmulatedMemory | None,
        batch: int,
        warmup: int,
        steps: int,
        budget_s: float,
        min_steps: int,
        profile_steps: int,
    ) -> None:
        super().__init__(writer, fit_index, memory)
        self.batch = batch
        self.warmup, self.steps, self.budget_s = warmup, steps, budget_s
        self.min_steps, self.profile_steps = min_steps, profile_steps
        self.skips = SkipCounter()
        self.done_steps = 0
        self.warmup_steps: list[dict[str, Any]] = []
        self.timed: list[dict[str, Any]] = []
        self.profile: list[dict[str, float]] = []
        self.marks: dict[str, float] = {}
        self.timed_start = 0.0
        self.phase = "warmup"
        self.setup_started = self.fit_started = 0.0

    def _mark(self, name: str) -> None:
        if self.phase == "profile":
            sync(self.device)
            self.marks[name] = time.perf_counter()

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        sync(self.device)
        if self.done_steps == 0:
            self.record(event="first_step", batch=self.batch, live=live_memory(self.device))
            _reset_peak(self.device)
        if self.phase == "warmup" and self.done_steps == self.warmup:
            self.phase, self.timed_start = "timed", time.perf_counter()
            _reset_peak(self.device)
        self.worst = self.phase == "warmup" and self.done_steps == 0
        self.marks = {"start": time.perf_counter()}

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        self._mark("backward")

    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._mark("optimizer")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        sync(self.device)
        end = time.perf_counter()
        self.done_steps += 1
        if self.done_steps == 1:
            self.record_memory("first_step_end")
        before = self.skips.skipped
        skipped = self.skips.update(trainer) > before
        assert isinstance(pl_module, StepSource)
        self.batch = pl_module.last_batch
        step = {"s": end - self.marks["start"], "skipped": skipped, **pl_module.last_facts}
        if self.phase == "warmup":
            self.warmup_steps.append(step)
        elif self.phase == "timed":
            self.timed.append(step)
            if timing_done(self.timed, end - self.timed_start, self.steps, self.min_steps, self.budget_s):
                self.phase = "profile" if self.profile_steps else "end"
        elif self.phase == "profile" and not skipped:
            marks = self.marks
            self.profile.append(
                {
                    "forward": marks.get("backward", end) - marks["start"],
                    "backward": marks.get("optimizer", end) - marks.get("backward", end),
                    "optimizer": end - marks.get("optimizer", end),
                }
            )
            if len(self.profile) >= self.profile_steps:
                self.phase = "end"
        if self.phase == "end":
            self._finish(trainer)

    def _finish(self, trainer: L.Trainer) -> None:
        allocated, reserved = self.peak_bytes()
        self.record(
            event="measured",
            batch=self.batch,
            world_size=trainer.world_size,
            warmup=self.warmup,
            warmup_steps=self.warmup_steps,
            steps=self.timed,
            profile=self.profile,
            peak_allocated=allocated,
            peak_reserved=reserved,
            skipped_total=self.skips.skipped,
            setup_s=round(self.fit_started - self.setup_started, 1),
            peak_rss=own_peak_rss(),
            engine=engine_settings(getattr(trainer.strategy, "deepspeed_engine", None)),
            **auto_choice(trainer.strategy),
        )
        trainer.should_stop = True

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self.setup_started = time.perf_counter()

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.fit_started = time.perf_counter()


def engine_settings(engine: Any) -> dict[str, Any]:
    """What a DeepSpeed engine runs with, read through its public getters (DeepSpeed's defaults included), so that
    two rows' engines can be compared setting by setting (empty without an engine)."""
    if engine is None:
        return {}
    getters = (
        "zero_optimization_stage",
        "zero_overlap_comm",
        "zero_contiguous_gradients",
        "zero_reduce_bucket_size",
        "zero_allgather_bucket_size",
        "zero_reduce_scatter",
        "zero_cpu_offload",
        "gradient_clipping",
        "bfloat16_enabled",
        "fp16_enabled",
        "gradient_accumulation_steps",
        "train_micro_batch_size_per_gpu",
        "zero_sub_group_size",
        "zero_prefetch_bucket_size",
        "zero_param_persistence_threshold",
    )
    found: dict[str, Any] = {name: getattr(engine, name)() for name in getters if hasattr(engine, name)}
    offload = engine.zero_offload_optimizer() if hasattr(engine, "zero_offload_optimizer") else None
    if offload is not None:
        found["offload_optimizer"] = {k: str(v) for k, v in offload.model_dump().items()}
    found["optimizer"] = type(engine.optimizer).__name__
    found["basic_optimizer"] = type(getattr(engine, "basic_optimizer", None)).__name__
    return {
        key: value if isinstance(value, (bool, int, float, str, dict)) else str(value) for key, value in found.items()
    }


def auto_choice(strategy: Any) -> dict[str, Any]:
    """What ``zero_auto`` planned, tried and chose (nothing for other strategies), also where it handed the run to a
    one-card strategy."""
    strategy = getattr(strategy, "chosen_by", strategy)
    chosen = getattr(strategy, "chosen", None)
    if chosen is None:
        return {}
    return {
        "auto": {
            "chosen": chosen.name,
            "accumulation": chosen.accumulation,
            "from_cache": strategy.from_cache,
            "trials": [[m.candidate.name, m.fits, round(m.samples_per_sec, 2), m.reason] for m in strategy.trials],
            "trial_peaks": [m.peak_bytes for m in strategy.trials],
            "plan": [[row.layout.name, row.max_micro_batch] for row in strategy.plan_rows],
        }
    }


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def session_info(device: str) -> dict[str, Any]:
    """Versions and hardware facts recorded with every row."""
    import lightning

    info: dict[str, Any] = {
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "lightning": lightning.__version__,
        "cpus": os.cpu_count(),
    }
    for name in ("transformers", "deepspeed", "fairscale"):
        try:
            info[name] = __import__(name).__version__
        except ImportError:
            info[name] = None
    if device == "gpu" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_memory=props.total_memory, gpu_uuid=str(getattr(props, "uuid", "")))
    return info


def _controller(fit: dict[str, Any], spec: dict[str, Any], writer: RecordWriter, index: int) -> Controller:
    rank = int(os.environ.get("RANK", "0"))
    cap = int(spec["memory_cap_gib"] * 1024**3)
    emulated = spec.get("emulated_memory") or []
    memory = EmulatedMemory(float(emulated[rank][0]), float(emulated[rank][1]), cap) if rank < len(emulated) else None
    if fit["mode"] == "search":
        return SearchController(writer, index, memory, SearchPolicy(**fit["policy"]), cap)
    return MeasureController(
        writer,
        index,
        memory,
        batch=int(fit["batch"]),
        warmup=int(fit["warmup"]),
        steps=int(fit["steps"]),
        budget_s=float(fit["budget_s"]),
        min_steps=int(fit["min_steps"]),
        profile_steps=int(fit.get("profile_steps", 0)),
    )


def run_fit(fit: dict[str, Any], spec: dict[str, Any], writer: RecordWriter, index: int) -> None:
    """One ``Trainer.fit``: a search or a measurement of one row (a fresh Trainer and model)."""
    experiment = find_experiment(fit["experiment"])
    strategy_spec = experiment.strategy(fit["strategy"])
    lengths = experiment.length(fit["lengths"])
    controller = _controller(fit, spec, writer, index)
    cap = float(spec["memory_cap_gib"])
    precision = fit.get("precision") or spec["precision"]
    controller.record(event="start", mode=fit["mode"], label=fit.get("label", fit["strategy"]))
    if strategy_spec.kind == "accelerate":
        from benchmarks.bench.accelerate_run import run_accelerate_fit

        start = int(fit["batch"] if fit["mode"] == "measure" else fit["policy"]["start"])
        given = fit.get("deepspeed_config")
        run_accelerate_fit(experiment, strategy_spec, lengths, controller, cap, precision, start, index, given)
        reset_memory(controller.device)
        return
    by_loader = strategy_spec.loader_driven
    module = BenchModule(
        experiment,
        strategy_spec,
        lengths,
        None if by_loader else controller.next_batch,
        cap,
        seed=index,
        batch_size=int(fit.get("batch", 1)),
    )
    trainer = L.Trainer(
        accelerator=spec["accelerator"],
        devices=int(spec["devices"]),
        strategy=make_strategy(
            strategy_spec, int(spec["devices"]), fit.get("deepspeed_config"), cap, spec["accelerator"]
        ),
        precision=precision,
        max_steps=MAX_STEPS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        callbacks=[controller],
    )
    if by_loader:
        trainer.fit(module)
    else:
        trainer.fit(module, step_loader(MAX_STEPS))
    del trainer, module
    reset_memory(controller.device)


def main(spec_path: str) -> None:
    """Run every fit of the spec in order, in this process (rank ``$RANK`` of ``spec['devices']``)."""
    spec = json.loads(Path(spec_path).read_text())
    rank = int(os.environ.get("RANK", "0"))
    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    writer = RecordWriter(Path(spec["progress_dir"]) / f"rank{rank}.jsonl")
    writer.write({"event": "session", "rank": rank, "session": session_info(spec["accelerator"])})
    try:
        for index, fit in enumerate(spec["fits"]):
            run_fit(fit, spec, writer, index)
    except torch.OutOfMemoryError:
        writer.write({"event": "oom", "batch": None, "where": "setup"})
        os._exit(EXIT_OOM)
    except BaseException:
        writer.write({"event": "error", "error": traceback.format_exc()[-3000:]})
        os._exit(EXIT_ERROR)
    writer.write({"event": "exit"})
    sys.stdout.flush()
    os._exit(0)
