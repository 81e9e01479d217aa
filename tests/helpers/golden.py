"""Golden losses: the first training losses of each task under each backend family, pinned in ``tests/golden/``.

    python tests/helpers/golden.py OUT_DIR [--cases causal_lm-ddp ...]   # a fresh run (2 CPU processes)
    python tests/helpers/golden.py --commit     # regenerate the committed files of this kind of CPU

A case is ``TASK-BACKEND``: a tiny model of each task (classification, seq2seq, causal LM) on shipped data, trained
for :data:`STEPS` steps in ``32-true`` on 2 CPU processes under one strategy of each backend family. Rank 0 writes
``OUT_DIR/<case>.json`` with the per-step training losses (mean over ranks). All cases share one process group, so
a case costs seconds, not a launch. ``tests/test_golden_losses.py`` compares a fresh run with the committed files
of the CPU's instruction set and vendor (torch's kernels differ between AVX2 and AVX512, and between Intel and AMD,
in the last bit) exactly: a refactor that changes any loss by one bit fails it. Regenerate only for an intended
change of behaviour, on each kind of CPU, and say which in the commit message.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

import lightning_zero  # noqa: F401  (registers the presets)
from tests.helpers.trainer import end_process_group, quiet_trainer

STEPS = 5
SEED = 42
BPE = "bpe:chitchat:1024"
MINILM = "sentence-transformers/all-MiniLM-L6-v2"
#: One strategy of each backend family.
BACKENDS = {"ddp": "ddp", "deepspeed": "zero3", "fairscale": "zero2_fairscale", "fsdp2": "zero3_fsdp"}
TASKS = ("classification", "seq2seq", "causal_lm")
CASES = [f"{task}-{backend}" for task in TASKS for backend in BACKENDS]
GOLDEN = Path(__file__).resolve().parents[1] / "golden"


def committed_dir() -> Path:
    """Where this CPU's committed losses are: one folder per instruction set torch's kernels use and CPU vendor
    (an Intel and an AMD CPU, both ``AVX512`` to torch, differ in the last bit: the math libraries pick their
    kernels by vendor too)."""
    return GOLDEN / f"{torch.backends.cpu.get_cpu_capability()}-{cpu_vendor()}"


def cpu_vendor() -> str:
    """The CPU's vendor as Linux names it (``GenuineIntel``, ``AuthenticAMD``), or ``unknown``."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("vendor_id")), "unknown")


def classification(cache_dir: str | None) -> tuple[L.LightningModule, L.LightningDataModule]:
    from lightning_zero.app.data.movie_reviews import MovieReviewsDataModule
    from lightning_zero.app.tasks.classification import SequenceClassificationTask

    task = SequenceClassificationTask(
        model="shape:tiny-deberta-v2", tokenizer=MINILM, learning_rate=1e-3, weight_decay=0.01, warmup_ratio=0.4
    )
    data = MovieReviewsDataModule(tokenizer=MINILM, max_length=32, batch_size=4, limit_train=64, limit_val=8)
    return task, data


def seq2seq(cache_dir: str | None) -> tuple[L.LightningModule, L.LightningDataModule]:
    from lightning_zero.app.data.dialog import ChitChatDataModule
    from lightning_zero.app.tasks.seq2seq import Seq2SeqTask

    common: dict[str, Any] = {"tokenizer": BPE, "tokenizer_cache_dir": cache_dir, "max_target_length": 16}
    task = Seq2SeqTask(
        model="shape:tiny-blenderbot", learning_rate=1e-3, weight_decay=0.01, generate_on_validation=False, **common
    )
    data = ChitChatDataModule(batch_size=4, limit_train=64, limit_val=8, max_source_length=32, **common)
    return task, data


def causal_lm(cache_dir: str | None) -> tuple[L.LightningModule, L.LightningDataModule]:
    from lightning_zero.app.data.text_corpus import TextBlocksDataModule
    from lightning_zero.app.tasks.causal_lm import CausalLMTask

    common: dict[str, Any] = {"tokenizer": BPE, "tokenizer_cache_dir": cache_dir}
    task = CausalLMTask(model="shape:tiny-gpt2", learning_rate=1e-3, weight_decay=0.01, **common)
    data = TextBlocksDataModule(block_size=32, batch_size=4, limit_train=64, limit_val=8, **common)
    return task, data


BUILDERS: dict[str, Callable[[str | None], tuple[L.LightningModule, L.LightningDataModule]]] = {
    "classification": classification,
    "seq2seq": seq2seq,
    "causal_lm": causal_lm,
}


class LossRecorder(Callback):
    """Every training step's loss, averaged over ranks."""

    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.losses.append(float(trainer.strategy.reduce(loss.detach().clone(), reduce_op="mean")))


def run_case(case: str, cache_dir: str | None) -> dict[str, Any] | None:
    """Train one case; the result (losses and what produced them) on global rank 0, None elsewhere."""
    task_name, backend = case.split("-")
    L.seed_everything(SEED, verbose=False)
    task, data = BUILDERS[task_name](cache_dir)
    recorder = LossRecorder()
    trainer = quiet_trainer(
        devices=2,
        strategy=BACKENDS[backend],
        max_steps=STEPS,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        callbacks=[recorder],
    )
    trainer.fit(task, data)
    if not trainer.is_global_zero:
        return None
    return {"case": case, "strategy": BACKENDS[backend], "steps": STEPS, "losses": recorder.losses}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("out", type=Path, nargs="?", help="where <case>.json files go")
    where.add_argument("--commit", action="store_true", help="write this CPU's committed files")
    parser.add_argument("--cases", nargs="+", default=CASES, choices=CASES)
    parser.add_argument("--tokenizer-cache-dir", help="where the trained BPE is kept (the package's default if unset)")
    args = parser.parse_args()
    out = committed_dir() if args.commit else args.out
    torch.set_num_threads(1)
    out.mkdir(parents=True, exist_ok=True)
    fairscale = importlib.util.find_spec("fairscale") is not None
    for case in args.cases:
        if case.endswith("-fairscale") and not fairscale:
            continue  # an optional backend: its test is skipped too
        result = run_case(case, args.tokenizer_cache_dir)
        if result is not None:
            (out / f"{case}.json").write_text(json.dumps(result, indent=1) + "\n")
    end_process_group()


if __name__ == "__main__":
    main()
