"""What a trial's fit reports through, shared by the Lightning worker (:mod:`benchmarks.bench.worker`) and the
Accelerate loop (:mod:`benchmarks.bench.accelerate_run`): the :class:`Controller` callback, the rank's record
writer, the CUDA memory readings, and the emulated memory of CPU tests.
"""

from __future__ import annotations

import gc
import json
import os
import time
import traceback
from pathlib import Path
from typing import Any, TextIO

import lightning as L
import torch

EXIT_OOM = 3
EXIT_ERROR = 4


class RecordWriter:
    """Appends JSON records to one rank's progress file, flushed at once."""

    def __init__(self, path: Path) -> None:
        self.handle: TextIO = path.open("a")

    def write(self, record: dict[str, Any]) -> None:
        self.handle.write(json.dumps({"t": round(time.time(), 3), **record}) + "\n")
        self.handle.flush()


def sync(device: torch.device) -> None:
    """Wait for a CUDA ``device``'s queued work (nothing elsewhere)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_bytes(device: torch.device) -> tuple[int, int]:
    """Peak allocated and reserved bytes of a CUDA ``device`` since the last reset (0, 0 elsewhere)."""
    if device.type != "cuda":
        return 0, 0
    return torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)


def largest_live_blocks(segments: list[dict[str, Any]], count: int = 16) -> list[float]:
    """The ``count`` largest allocated blocks of a CUDA memory snapshot (``torch.cuda.memory_snapshot()``), in
    MiB, largest first."""
    sizes = [
        block["size"] for segment in segments for block in segment["blocks"] if block["state"] == "active_allocated"
    ]
    return [round(size / 2**20, 1) for size in sorted(sizes, reverse=True)[:count]]


def live_memory(device: torch.device) -> dict[str, Any]:
    """What the process holds on a CUDA ``device`` now: allocated GiB and the largest blocks (empty elsewhere), to
    tell what a run holds that a ``zero_auto`` trial of it did not."""
    if device.type != "cuda":
        return {}
    return {
        "allocated_gib": round(torch.cuda.memory_allocated(device) / 2**30, 2),
        "largest_blocks_mib": largest_live_blocks(torch.cuda.memory_snapshot()),
    }


def reset_memory(device: torch.device) -> None:
    """Empty a CUDA ``device``'s allocator cache and reset its peaks."""
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


class EmulatedMemory:
    """A stand-in for GPU memory on CPU: ``base + per_sample * batch`` bytes, an OOM above the cap (tests only)."""

    def __init__(self, base: float, per_sample: float, cap: float) -> None:
        self.base, self.per_sample, self.cap = base, per_sample, cap
        self.high = 0.0

    def allocate(self, batch: int) -> None:
        need = self.base + self.per_sample * batch
        if need > self.cap:
            raise torch.OutOfMemoryError(f"emulated memory cap: batch {batch} needs {need:.0f} > {self.cap:.0f} bytes")
        self.high = max(self.high, need)

    def peak(self) -> tuple[int, int]:
        return int(self.high), int(self.high)

    def reset(self) -> None:
        self.high = 0.0


class Controller(L.Callback):
    """Decides each step's micro-batch and records what happened; ends the fit when done."""

    def __init__(self, writer: RecordWriter, fit_index: int, memory: EmulatedMemory | None) -> None:
        self.writer, self.fit_index, self.memory = writer, fit_index, memory
        self.batch = 1
        self.worst = True
        self.device = torch.device("cpu")

    def next_batch(self) -> tuple[int, bool]:
        if self.memory is not None:
            self.memory.allocate(self.batch)
        return self.batch, self.worst

    def peak_bytes(self) -> tuple[int, int]:
        return self.memory.peak() if self.memory is not None else peak_bytes(self.device)

    def record(self, **fields: Any) -> None:
        self.writer.write({"fit": self.fit_index, **fields})

    def record_memory(self, event: str, **fields: Any) -> None:
        """Record ``event`` with the peak memory since the last reset and what the process holds now."""
        allocated, reserved = self.peak_bytes()
        live = live_memory(self.device)
        self.record(event=event, peak_allocated=allocated, peak_reserved=reserved, live=live, **fields)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.device = trainer.strategy.root_device

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if isinstance(exception, torch.OutOfMemoryError):
            text = "".join(traceback.format_exception(exception))  # a chained error's cause comes first
            where = text if len(text) <= 4000 else f"{text[:2500]}\n...\n{text[-1500:]}"
            self.record_memory("oom", batch=self.batch, where=where)
            os._exit(EXIT_OOM)
        self.record(event="error", batch=self.batch, error=traceback.format_exc()[-3000:])
        os._exit(EXIT_ERROR)
