"""Run several LightningCLI configs one after another in one 2-process launch, as ``main.py fit`` runs each.

    python tests/helpers/configs_run.py ROOT CONFIG... -- OVERRIDE...

Each config gets ``--trainer.default_root_dir=ROOT/<config stem>`` and the overrides, and goes through
``lightning_zero.app.cli.main`` exactly as ``python main.py fit --config CONFIG OVERRIDE...`` would; the configs share
one process group, so each costs seconds, not a launch. Before each run every rank prints ``config: <stem>``;
the first config that fails ends the launch with its exit status.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from lightning_zero.app.cli import main as cli_main
from tests.helpers.trainer import end_process_group


def main() -> None:
    root, *rest = sys.argv[1:]
    split = rest.index("--") if "--" in rest else len(rest)
    configs, overrides = rest[:split], rest[split + 1 :]
    for config in configs:
        stem = Path(config).stem
        print(f"config: {stem}", flush=True)
        status = cli_main(["fit", f"--config={config}", f"--trainer.default_root_dir={root}/{stem}", *overrides])
        if status:
            sys.exit(status)
    end_process_group()


if __name__ == "__main__":
    main()
