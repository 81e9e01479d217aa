"""A 2-process ZeRO-3 run that finishes, for the test that its process groups are ended before Python finalises.

    python tests/helpers/exit_run.py OUT_DIR

An exit handler registered before the run, so that it runs after any the run registers, writes
``OUT_DIR/exit-rank<r>.json``: whether torch's process group is still up and whether DeepSpeed still holds its
copy of the world group.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

import lightning_zero  # noqa: F401  (registers the presets)
from lightning_zero.strategies.deepspeed import DeepSpeedZeroStrategy
from tests.helpers.tiny import TinyLM
from tests.helpers.trainer import quiet_trainer


def write_what_is_left(out: Path) -> None:
    from deepspeed.utils import groups

    left = {
        "torch_group_up": torch.distributed.is_initialized(),
        "deepspeed_group_held": groups._WORLD_GROUP is not None,
    }
    (out / f"exit-rank{os.environ.get('LOCAL_RANK', '0')}.json").write_text(json.dumps(left))


def main() -> None:
    out = Path(sys.argv[1])
    torch.set_num_threads(1)
    atexit.register(write_what_is_left, out)
    trainer = quiet_trainer(devices=2, strategy="zero3", max_steps=2)
    trainer.fit(TinyLM())
    assert isinstance(trainer.strategy, DeepSpeedZeroStrategy)
    trainer.strategy.full_state_dict()  # ZeRO-3 gathers: the collectives a process most often ends on


if __name__ == "__main__":
    main()
