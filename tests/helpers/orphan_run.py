"""A 2-process run in which one rank fails at step 3, for the no-orphaned-ranks tests.

    python tests/helpers/orphan_run.py OUT_DIR STRATEGY FAILING_RANK {raise,kill}

Every rank writes ``OUT_DIR/pid-<rank>`` when training starts; the failing rank writes ``OUT_DIR/failed-at``
(a time stamp) and then raises an exception or sends itself SIGKILL (as ``kill -9`` or the OOM killer would).
The run is long enough (thousands of steps) that the other rank would otherwise wait in a collective.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import lightning as L
import torch

import lightning_zero  # noqa: F401  (registers the presets)
from tests.helpers.tiny import TinyLM
from tests.helpers.trainer import quiet_trainer


class FailAtStep(L.Callback):
    """Records each rank's pid; makes ``rank`` fail after step 3."""

    def __init__(self, out: Path, rank: int, how: str) -> None:
        self.out, self.rank, self.how = out, rank, how

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        (self.out / f"pid-{trainer.global_rank}").write_text(str(os.getpid()))

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if trainer.global_step != 3 or trainer.global_rank != self.rank:
            return
        (self.out / "failed-at").write_text(repr(time.time()))
        if self.how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError(f"injected failure on rank {self.rank}")


def main() -> None:
    out, strategy, rank, how = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    torch.set_num_threads(1)
    trainer = quiet_trainer(
        devices=2,
        strategy=strategy,
        max_steps=100_000,
        callbacks=[FailAtStep(out, rank, how)],
    )
    trainer.fit(TinyLM())


if __name__ == "__main__":
    main()
