"""Train the tiny GPT-2 under several strategies in one 2-process launch and save what each produced.

    python tests/helpers/parity_run.py OUT_DIR --steps 12 --strategies ddp zero2 zero3

For each strategy, rank 0 writes OUT_DIR/NAME.pt with the per-step losses (mean over ranks), the full
final state dict, each rank's footprint (local/full parameter elements, optimizer-state elements), and whether
the module was freed once the run's Trainer and module were dropped.
Strategies share one process group, so each extra one costs seconds, not a new launch.
"""

from __future__ import annotations

import argparse
import gc
import sys
import weakref
from dataclasses import astuple
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import lightning as L
import torch

import lightning_zero  # noqa: F401  (registers the presets)
from lightning_zero import ZeroStrategy, build_preset
from lightning_zero.memory.footprint import rank_footprint
from tests.helpers.shared_launch import announce
from tests.helpers.tiny import TinyLM
from tests.helpers.trainer import end_process_group, quiet_trainer


def make_strategy(spec: str, out: Path) -> Any:
    """A registered name, ``config:PATH`` for a ZeroStrategy built from a DeepSpeed config file, or
    ``nvme:DIR`` for the NVMe offload preset swapping into DIR (a relative DIR: inside ``out``)."""
    if spec.startswith("config:"):
        return ZeroStrategy(deepspeed_config=spec.removeprefix("config:"))
    if spec.startswith("nvme:"):
        swap = out / spec.removeprefix("nvme:")
        swap.mkdir(parents=True, exist_ok=True)
        return build_preset("zero3_offload_nvme", nvme_path=str(swap))
    if spec.startswith("compiled:"):
        return build_preset(spec.removeprefix("compiled:"), compile_blocks=True)
    return spec


def make_trainer(spec: str, steps: int, precision: Any, out: Path, accelerator: str = "cpu") -> L.Trainer:
    return quiet_trainer(
        accelerator=accelerator,
        devices=2,
        strategy=make_strategy(spec, out),
        precision=precision,
        max_steps=steps,
        enable_checkpointing=False,
    )


def result_name(spec: str) -> str:
    if spec.startswith("nvme:"):
        return "zero3_offload_nvme"
    if spec.startswith("compiled:"):
        return spec.removeprefix("compiled:") + "_compiled"
    return Path(spec.removeprefix("config:")).stem if spec.startswith("config:") else spec


def train(spec: str, steps: int, precision: str, out: Path, accelerator: str) -> None:
    L.seed_everything(7)
    module = TinyLM()
    trainer = make_trainer(spec, steps, precision, out, accelerator=accelerator)
    trainer.fit(module)
    footprint = torch.tensor(astuple(rank_footprint(module, trainer.optimizers)), device=trainer.strategy.root_device)
    footprints = trainer.strategy.all_gather(footprint).tolist()
    gather = getattr(trainer.strategy, "full_state_dict", None)
    state = gather() if gather is not None else module.state_dict()
    result = {
        "losses": module.losses,
        "batch_fingerprints": module.batch_fingerprints,
        "state_dict": {k: v.detach().float().cpu().clone() for k, v in state.items()},
        "footprints": footprints,
        "zero3_modules_left": zero3_modules_left(trainer),
    }
    is_global_zero = trainer.is_global_zero
    alive = weakref.ref(module)
    del trainer, module, state, gather
    gc.collect()
    result["module_freed"] = alive() is None  # nothing outlives the run: no engine, optimizer or parameters
    if is_global_zero:
        torch.save(result, out / f"{result_name(spec)}.pt")
    torch.distributed.barrier()


def zero3_modules_left(trainer: L.Trainer) -> int:
    """How many of the finished run's modules DeepSpeed's ZeRO-3 still holds on its module-level stack."""
    from deepspeed.runtime.zero import parameter_offload

    model = trainer.strategy.model
    ours = {id(submodule) for submodule in model.modules()} if model is not None else set()
    return sum(id(entry) in ours for entry in parameter_offload.FWD_MODULE_STACK)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--strategies", nargs="+", required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for spec in args.strategies:
        announce(spec)
        train(spec, args.steps, args.precision, args.out, args.accelerator)
    end_process_group()


if __name__ == "__main__":
    main()
