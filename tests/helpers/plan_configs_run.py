"""``lightning-zero plan`` on every shipped config, in one CPU process: each config's plan or its one error line.

    python tests/helpers/plan_configs_run.py OUT.json CONFIG.yaml [CONFIG.yaml ...]

OUT.json maps each config's stem to its probe method, activation bytes per sample, micro-batch and rows (layout
name, fits, largest micro-batch), or to ``{"error": LINE}``; ``peak_rss_bytes`` is the process's peak resident
memory after the last plan.
"""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from lightning_zero.app.plan_command import plan_for_config
from lightning_zero.errors import ZeroConfigError


def planned(config: Path) -> dict[str, Any]:
    try:
        result = plan_for_config(config, budget_gib=24)
    except ZeroConfigError as error:
        return {"error": str(error)}
    return {
        "method": result.probe.method,
        "per_sample": result.probe.per_sample,
        "per_sample_checkpointed": result.probe.per_sample_checkpointed,
        "micro_batch": result.micro_batch,
        "precision": result.precision,
        "rows": [(row.layout.name, row.fits, row.max_micro_batch) for row in result.rows],
    }


def main() -> None:
    out, configs = Path(sys.argv[1]), [Path(arg) for arg in sys.argv[2:]]
    results: dict[str, Any] = {config.stem: planned(config) for config in configs}
    results["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out.write_text(json.dumps(results))


if __name__ == "__main__":
    main()
