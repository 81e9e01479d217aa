"""Run a lightning-zero job: ``python main.py fit --config configs/quickstart.yaml``."""

import sys

from lightning_zero.app.cli import main

if __name__ == "__main__":
    sys.exit(main())
