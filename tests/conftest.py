import sys
from pathlib import Path

import lightning_zero  # noqa: F401  (registers the presets for every test)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
