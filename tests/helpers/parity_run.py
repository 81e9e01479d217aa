"""Train the tiny GPT-2 under several strategies in one 2-process launch and save what each produced.

    python tests/helpers/parity_run.py OUT_DIR --steps 12 --strategies ddp zero2 zero3

For each strategy, rank 0 writes OUT_DIR/NAME.pt with the per-step losses (mean over ranks), the full
final state dict, and each rank's footprint (local/full parameter elements, optimizer-state elements).
Strategies share one process group, so each extra one costs seconds, not a new launch.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import astuple
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import lightning as L  # noqa: E402
import torch  # noqa: E402

import lightning_zero  # noqa: E402, F401  (registers the presets)
from lightning_zero.memory.footprint import rank_footprint  # noqa: E402
from tests.helpers.tiny import TinyLM  # noqa: E402


def train(strategy: str, steps: int, precision: str, out: Path) -> None:
    L.seed_everything(7)
    module = TinyLM()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        precision=precision,
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=True,
    )
    trainer.fit(module)
    footprint = torch.tensor(astuple(rank_footprint(module, trainer.optimizers)))
    footprints = trainer.strategy.all_gather(footprint).tolist()
    gather = getattr(trainer.strategy, "full_state_dict", None)
    state = gather() if gather is not None else module.state_dict()
    if trainer.is_global_zero:
        result = {
            "losses": module.losses,
            "state_dict": {k: v.detach().float().cpu().clone() for k, v in state.items()},
            "footprints": footprints,
        }
        torch.save(result, out / f"{strategy}.pt")
    trainer.strategy.barrier()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--strategies", nargs="+", required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for strategy in args.strategies:
        train(strategy, args.steps, args.precision, args.out)


if __name__ == "__main__":
    main()
