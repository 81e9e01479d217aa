"""A 2-process Fabric run in which rank 0 kills itself at step 3, for the no-orphaned-ranks test.

    python tests/helpers/fabric_orphan_run.py OUT_DIR STRATEGY

Every rank writes ``OUT_DIR/pid-<rank>`` when training starts; at step 3 rank 0 writes ``OUT_DIR/failed-at`` and
sends itself SIGKILL (as ``kill -9`` or the OOM killer would) while rank 1 does ten minutes of work of its own (as a
rank-local evaluation or data preparation would): a gloo collective would fail by itself on the lost connection,
work outside collectives goes on unless the watchdog ends it.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import lightning as L
import torch

import lightning_zero  # noqa: F401  (registers the presets with Fabric's registry)
from tests.helpers.tiny import TinyLM, token_data


def main() -> None:
    out, strategy = Path(sys.argv[1]), sys.argv[2]
    torch.set_num_threads(1)
    fabric = L.Fabric(accelerator="cpu", devices=2, strategy=strategy, precision="32-true")
    fabric.launch()
    module = TinyLM(scheduler=False)
    model, optimizer = fabric.setup(module, torch.optim.AdamW(module.parameters(), lr=1e-3))
    (out / f"pid-{fabric.global_rank}").write_text(str(os.getpid()))
    batch = token_data(8).tensors[0][:4]
    for step in range(100_000):
        fabric.backward(model(batch))
        optimizer.step()
        optimizer.zero_grad()
        if step == 3 and fabric.global_rank == 0:
            (out / "failed-at").write_text(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        if step == 3:
            time.sleep(600)


if __name__ == "__main__":
    main()
