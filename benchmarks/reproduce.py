"""Reproduce the reports' experiments on this machine: experiments x strategies -> one table.

    python benchmarks/reproduce.py run --out benchmarks/results/DATE-NAME --experiments t5-3b,gpt2-xl --prebuild-ops
    python benchmarks/reproduce.py report benchmarks/results/DATE-NAME --plots

See benchmarks/README.md for the method, and its campaigns list for the results.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench.main import main

if __name__ == "__main__":
    main()
