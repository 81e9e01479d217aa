"""Scenarios of the batch-size finder and zero_auto in one 2-process CPU launch; each rank writes what it saw.

    python tests/helpers/fit_run.py OUT_DIR --scenarios budget oom global plain auto auto_again auto_global auto_zero3

A synthetic memory-hungry module "uses" ``MIB_PER_SAMPLE`` MiB per sample; the finder's injected check compares
that with a per-rank emulated budget, and the ``oom`` scenario raises ``torch.OutOfMemoryError`` on rank 1 only.
Rank r writes OUT_DIR/SCENARIO-rank{r}.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning_zero  # noqa: F401  (registers the presets)
from lightning_zero import build_preset
from lightning_zero.callbacks.batch_size import ZeroBatchSizeFinder
from lightning_zero.errors import ZeroConfigError
from tests.helpers.trainer import end_process_group, quiet_trainer

MIB_PER_SAMPLE = 1
BUDGET_MIB = {0: 10, 1: 6}  # rank 1 has the smaller emulated budget: both must stop at 6
OOM_ABOVE = 5  # the oom scenario: rank 1 runs out of memory above 5 samples
STEPS = 4


class Hungry(L.LightningModule):
    """A small regression MLP that records how much memory a micro-batch "uses"."""

    def __init__(self, batch_size: int = 2, oom_above: int | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
        self.batch_size = batch_size
        self.oom_above = oom_above
        self.used_mib = 0
        self.losses: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        self.used_mib = len(x) * MIB_PER_SAMPLE
        if self.oom_above is not None and self.global_rank == 1 and len(x) > self.oom_above:
            raise torch.OutOfMemoryError("emulated: CUDA out of memory. Tried to allocate 2.00 GiB")
        loss = nn.functional.mse_loss(self.net(x).squeeze(-1), y)
        self.log("train_loss", loss)
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        loss = outputs["loss"].detach().clone()
        self.losses.append(float(self.trainer.strategy.reduce(loss, reduce_op="mean")))

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=1e-2)

    def train_dataloader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(1)
        data = TensorDataset(torch.randn(256, 16, generator=generator), torch.randn(256, generator=generator))
        return DataLoader(data, batch_size=self.batch_size, shuffle=False)


def within_emulated_budget(trainer: L.Trainer, module: L.LightningModule, micro_batch: int) -> bool:
    assert isinstance(module, Hungry)
    return module.used_mib <= BUDGET_MIB[trainer.global_rank]


def trainer_for(strategy: Any, callbacks: list[Any], accumulate: int = 1) -> L.Trainer:
    return quiet_trainer(
        devices=2,
        strategy=strategy,
        max_steps=STEPS,
        accumulate_grad_batches=accumulate,
        callbacks=callbacks,
    )


def run_finder(strategy: str, finder: ZeroBatchSizeFinder, oom_above: int | None = None) -> dict[str, Any]:
    L.seed_everything(7)
    module = Hungry(oom_above=oom_above)
    trainer = trainer_for(strategy, [finder])
    trainer.fit(module)
    return {
        "micro_batch": finder.micro_batch,
        "accumulation": finder.accumulation,
        "trainer_accumulation": trainer.accumulate_grad_batches,
        "module_batch_size": module.batch_size,
        "tried": {str(k): v for k, v in finder.tried.items()},
        "losses": module.losses,
    }


def run_plain(strategy: str, batch_size: int, accumulate: int) -> dict[str, Any]:
    L.seed_everything(7)
    module = Hungry(batch_size=batch_size)
    trainer_for(strategy, [], accumulate).fit(module)
    return {"losses": module.losses}


def run_auto(cache_file: Path, batch_size: int | str | None, max_trials: int = 2) -> dict[str, Any]:
    L.seed_everything(7)
    module = Hungry(batch_size=4)
    zero = {"memory_budget_gib": 1, "max_trials": max_trials, "trial_steps": 1, "cache_file": str(cache_file)}
    strategy = build_preset("zero_auto", **zero, batch_size=batch_size)
    trainer = quiet_trainer(
        devices=2,
        strategy=strategy,
        max_steps=STEPS,
    )
    engines_before = engines_alive()
    trainer.fit(module)
    assert strategy.chosen is not None
    return {
        "chosen": strategy.chosen.name,
        "micro_batch": strategy.chosen.micro_batch,
        "accumulation": trainer.accumulate_grad_batches,
        "stage": strategy.config["zero_optimization"]["stage"],
        "module_batch_size": module.batch_size,
        "from_cache": strategy.from_cache,
        "tried": [(m.candidate.name, m.fits, m.samples_per_sec) for m in strategy.trials],
        "losses": module.losses,
        "engines_added": engines_alive() - engines_before,
    }


def engines_alive() -> int:
    """DeepSpeed engines in memory (a run adds its own, and any trial engine that was not freed)."""
    import deepspeed

    gc.collect()
    return sum(isinstance(thing, deepspeed.DeepSpeedEngine) for thing in gc.get_objects())


def run_over_budget() -> dict[str, Any]:
    """A real set-up with model states over the budget: the strategy's one-line error, on every rank."""
    try:
        trainer_for(build_preset("zero1", memory_budget_gib=1e-6), []).fit(Hungry())
    except ZeroConfigError as error:
        return {"error": str(error)}
    return {"error": None}


def scenario(name: str, out: Path) -> dict[str, Any]:
    if name == "over_budget":
        return run_over_budget()
    if name in ("auto", "auto_again"):
        return run_auto(out / "zero_auto_cache.json", batch_size=None)
    if name == "auto_global":
        return run_auto(out / "zero_auto_cache.json", batch_size=16)
    if name == "auto_zero3":  # the third candidate is ZeRO-3
        return run_auto(out / "zero_auto_zero3_cache.json", batch_size=None, max_trials=3)
    if name == "budget":
        return run_finder("zero2", ZeroBatchSizeFinder(max_batch_size=32, fits=within_emulated_budget))
    if name == "oom":
        return run_finder("zero2", ZeroBatchSizeFinder(max_batch_size=32), oom_above=OOM_ABOVE)
    if name == "oom_ddp":
        return run_finder("ddp", ZeroBatchSizeFinder(max_batch_size=32), oom_above=OOM_ABOVE)
    if name in ("global", "global_zero3"):
        finder = ZeroBatchSizeFinder(max_batch_size=32, global_batch_size=16, fits=within_emulated_budget)
        return run_finder("zero3" if name.endswith("zero3") else "zero2", finder)
    if name in ("plain", "plain_zero3"):
        return run_plain("zero3" if name.endswith("zero3") else "zero2", batch_size=4, accumulate=2)
    raise SystemExit(f"unknown scenario {name}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--scenarios", nargs="+", required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    for name in args.scenarios:
        result = scenario(name, args.out)
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        (args.out / f"{name}-rank{rank}.json").write_text(json.dumps(result))
    end_process_group()


if __name__ == "__main__":
    main()
