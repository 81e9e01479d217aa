"""``zero_auto`` under Lightning Fabric in one 2-process launch: the tiny GPT-2 trained under ``zero_auto`` with a
budget, then under the preset it chose by name; and a budget no layout fits.

    python tests/helpers/fabric_auto_run.py OUT_DIR --steps 8 --budget 5e-4 --too-small 1e-5

Rank 0 writes OUT_DIR/zero_auto.pt and OUT_DIR/chosen.pt (as tests/helpers/fabric_run.py writes its results), and
OUT_DIR/choice.json: the layout ``zero_auto`` chose, its DeepSpeed stage and offload, and each rank's error for the
budget that is too small.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import lightning as L
import torch

from lightning_zero import build_fabric_preset
from lightning_zero.errors import ZeroConfigError
from tests.helpers.fabric_run import fabric_setup, fabric_train, full_state, save_result
from tests.helpers.trainer import end_process_group


def train(out: Path, name: str, strategy: Any, steps: int) -> L.Fabric:
    fabric = L.Fabric(accelerator="cpu", devices=2, strategy=strategy)
    fabric.launch()
    model, optimizer, _ = fabric_setup(fabric)
    losses = fabric_train(fabric, model, optimizer, 0, steps)
    save_result(fabric, out, name, losses, full_state(fabric, model))
    return fabric


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--budget", type=float, required=True)
    parser.add_argument("--too-small", type=float, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    auto = train(args.out, "zero_auto", build_fabric_preset("zero_auto", memory_budget_gib=args.budget), args.steps)
    chosen = auto.strategy.chosen  # type: ignore[attr-defined]
    zero = auto.strategy.zero  # type: ignore[attr-defined]
    preset = chosen.layout.name
    train(args.out, "chosen", preset, args.steps)
    fabric = L.Fabric(
        accelerator="cpu", devices=2, strategy=build_fabric_preset("zero_auto", memory_budget_gib=args.too_small)
    )
    fabric.launch()
    try:
        fabric_setup(fabric)
        error = ""
    except ZeroConfigError as refused:
        error = str(refused)
    errors = fabric.all_gather(torch.tensor([len(error)]))
    assert isinstance(errors, torch.Tensor)
    record = {"chosen": preset, "stage": zero.stage, "offload": zero.offload_optimizer, "error": error}
    if fabric.is_global_zero:
        (args.out / "choice.json").write_text(json.dumps({**record, "error_lengths": errors.flatten().tolist()}))
    fabric.barrier()
    end_process_group()


if __name__ == "__main__":
    main()
