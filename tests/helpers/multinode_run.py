"""Train the tiny GPT-2 under several strategies in one launch and save rank 0's per-step losses, for the
multi-node tests: the same script runs as 1 node x 2 processes (Lightning's launcher), as 2 nodes x 1 process
under torchrun, or as 2 nodes x 1 process with SLURM's environment (Lightning's cluster environments pick it up).

    python tests/helpers/multinode_run.py OUT_DIR --nodes 2 --devices 1 --strategies zero2 zero2_fairscale zero3_fsdp
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import lightning as L
import torch

import lightning_zero  # noqa: F401  (registers the presets)
from tests.helpers.tiny import TinyLM
from tests.helpers.trainer import end_process_group, quiet_trainer

STEPS = 4


def train(strategy: str, nodes: int, devices: int) -> tuple[list[float], str]:
    """Rank 0's per-step losses (mean over ranks) and the cluster environment Lightning chose."""
    L.seed_everything(7)
    module = TinyLM()
    trainer = quiet_trainer(
        num_nodes=nodes,
        devices=devices,
        strategy=strategy,
        max_steps=STEPS,
    )
    trainer.fit(module)
    assert trainer.world_size == nodes * devices and trainer.num_nodes == nodes
    environment = getattr(trainer.strategy, "cluster_environment", None)
    return module.losses, type(environment).__name__


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--devices", type=int, required=True)
    parser.add_argument("--strategies", nargs="+", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = {strategy: train(strategy, args.nodes, args.devices) for strategy in args.strategies}
    if torch.distributed.get_rank() == 0:
        torch.save(results, args.out / f"losses-{args.nodes}x{args.devices}.pt")
    end_process_group()


if __name__ == "__main__":
    main()
