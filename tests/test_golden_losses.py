"""Golden losses: a fresh run of every task under every backend family gives the committed losses, bit for bit.

One 2-process launch trains all cases (``tests/helpers/golden.py``, about 40 s); each case is then compared with
``tests/golden/<case>.json`` exactly, as torchtitan's loss-compare check does. Refactors must leave these
unchanged. After an intended change of behaviour, regenerate the files with
``python tests/helpers/golden.py tests/golden`` and say why in the commit.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.golden import CASES, STEPS
from tests.helpers.launch import run_script
from tests.helpers.runif import RunIf

GOLDEN = Path(__file__).parent / "golden"
RUNNER = Path(__file__).parent / "helpers" / "golden.py"


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("golden")
    cache = tmp_path_factory.mktemp("tokenizers")
    run_script(RUNNER, str(out), "--tokenizer-cache-dir", str(cache), timeout=300)
    return out


def _losses(path: Path) -> list[float]:
    losses: list[float] = json.loads(path.read_text())["losses"]
    return losses


@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=RunIf(fairscale=True)) if c.endswith("-fairscale") else c for c in CASES]
)
def test_losses_equal_the_golden_ones(fresh: Path, case: str) -> None:
    golden = _losses(GOLDEN / f"{case}.json")
    assert len(golden) == STEPS
    assert _losses(fresh / f"{case}.json") == golden  # exact: float32 values written in full


def test_golden_losses_differ_between_cases() -> None:
    # Each task trains its own model on its own data: equal curves would mean a case did not run what it names.
    curves = {case: tuple(_losses(GOLDEN / f"{case}.json")) for case in CASES}
    for task in ("classification", "seq2seq", "causal_lm"):
        assert len({curve for case, curve in curves.items() if case.startswith(task)}) >= 2
    assert len({curves[f"{task}-ddp"] for task in ("classification", "seq2seq", "causal_lm")}) == 3
