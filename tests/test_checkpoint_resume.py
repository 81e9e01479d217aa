"""Exact resume from a mid-epoch step checkpoint, for DDP and every preset, and from epoch-end ``max_steps`` saves.

The 2-process runs (helpers/checkpoint_run.py, one launch for every strategy) train the tiny GPT-2 with dropout on
shuffled data for 14 steps (6 an epoch) with ``ModelCheckpoint(every_n_train_steps=5, save_last="link")``; a
fresh module with perturbed weights and a fresh Trainer then resume with ``ckpt_path="last"`` (step 10, the 4th
batch of the second epoch) to step 14. Tolerance: none. Every strategy, CPU Adam (DeepSpeed offload) included,
runs the same float32 operations in the same order on the same machine, so the resumed run is bit-identical:
same batches, losses, learning rate and final weights (measured: max difference 0.0 for all eleven).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_zero.checkpoint.resume import ExactResume, fix_epoch_end_loop_state
from tests.helpers.backend_runs import ShortEpochLM
from tests.helpers.launch import run_script

RUNNER = Path(__file__).parent / "helpers" / "checkpoint_run.py"
STRATEGIES = [
    "ddp",
    "zero1",
    "zero2",
    "zero2_offload",
    "zero3",
    "zero3_offload",
    "zero1_fairscale",
    "zero2_fairscale",
    "zero2_fsdp",
    "zero3_fsdp",
    "zero3_offload_fsdp",
]
STEPS, EVERY = 14, 5


@pytest.fixture(scope="module")
def resumed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("resume")
    runs = [f"resume:{name}" for name in STRATEGIES]
    run_script(RUNNER, str(out), "--steps", str(STEPS), "--every", str(EVERY), "--runs", *runs, timeout=600)
    return out


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[key] - b[key]).abs().max().item() for key in a)


@pytest.mark.parametrize("name", STRATEGIES)
def test_resume_from_mid_epoch_step_checkpoint_is_exact(resumed: Path, name: str) -> None:
    result = torch.load(resumed / f"resume-{name}.pt", weights_only=False)
    uninterrupted, again = result["uninterrupted"], result["resumed"]
    start = (STEPS // EVERY) * EVERY
    assert again["global_step"] == uninterrupted["global_step"] == STEPS
    assert again["batch_fingerprints"] == uninterrupted["batch_fingerprints"][start:]
    assert again["losses"] == uninterrupted["losses"][start:]
    assert again["lr"] == uninterrupted["lr"]
    assert max_difference(again["state_dict"], uninterrupted["state_dict"]) == 0.0


def fit(steps: int, directory: Path, ckpt_path: str | None = None, **saving: Any) -> ShortEpochLM:
    L.seed_everything(7, verbose=False)
    module = ShortEpochLM()  # 48 samples, 12 steps an epoch in one process
    saver = ModelCheckpoint(dirpath=directory, save_last=True, save_top_k=-1, **saving)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        logger=False,
        callbacks=[saver, ExactResume()],
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, ckpt_path=ckpt_path)
    return module


@pytest.mark.parametrize(
    ("stop", "saving"),
    [
        pytest.param(12, {"save_on_train_epoch_end": True}, id="epoch-end"),
        pytest.param(8, {"save_on_train_epoch_end": True}, id="epoch-cut-short-by-max-steps"),
        pytest.param(12, {"every_n_train_steps": 12}, id="last-batch-of-epoch"),
        pytest.param(8, {"every_n_train_steps": 8}, id="mid-epoch"),
    ],
)
def test_max_steps_run_resumes_without_skipping_or_replaying(
    tmp_path: Path, one_thread: None, stop: int, saving: dict[str, Any]
) -> None:
    reference = fit(2 * stop, tmp_path / "reference")
    fit(stop, tmp_path / "run", **saving)
    resumed = fit(2 * stop, tmp_path / "run", ckpt_path="last", **saving)
    assert resumed.batch_fingerprints == reference.batch_fingerprints[stop:]
    assert max_difference(resumed.state_dict(), reference.state_dict()) == 0.0


def test_epoch_end_loop_state_becomes_the_last_batch_end_state() -> None:
    progress = {"ready": 1, "started": 1, "processed": 1, "completed": 0}
    batches = {"ready": 12, "started": 12, "processed": 12, "completed": 12}
    loops = {
        "fit_loop": {
            "epoch_progress": {"total": dict(progress), "current": dict(progress)},
            "epoch_loop.batch_progress": {"total": dict(batches), "current": dict(batches), "is_last_batch": True},
        }
    }
    assert fix_epoch_end_loop_state(loops)
    fit_loop = loops["fit_loop"]
    assert fit_loop["epoch_progress"]["total"]["processed"] == 0
    assert fit_loop["epoch_loop.batch_progress"]["current"]["completed"] == 11
    assert not fix_epoch_end_loop_state(loops), "a state written on a batch end is left as it is"
