"""Reading and comparing what the parity runners (``backend_runs.py``, ``parity_run.py``) saved for each run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tests.helpers.backend_runs import result_name


def load_result(out: Path, run: str) -> dict[str, Any]:
    """The result rank 0 saved for ``run`` (losses, final state dict, footprints ...) in ``out``."""
    result: dict[str, Any] = torch.load(out / f"{result_name(run)}.pt", weights_only=False)
    return result


def max_weight_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest element-wise difference between two state dicts with the same keys."""
    assert a.keys() == b.keys()
    return max((a[key] - b[key]).abs().max().item() for key in a)


def assert_same_training(result: dict[str, Any], reference: dict[str, Any], tolerance: dict[str, float]) -> None:
    """Same number of steps, losses within ``tolerance["loss"]``, final weights within ``tolerance["weight"]``."""
    assert len(result["losses"]) == len(reference["losses"]) > 0
    torch.testing.assert_close(
        torch.tensor(result["losses"]), torch.tensor(reference["losses"]), atol=tolerance["loss"], rtol=0
    )
    assert max_weight_difference(result["state_dict"], reference["state_dict"]) <= tolerance["weight"]
