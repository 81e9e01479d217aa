"""Our DeepSpeed strategy adds no work to a training step: the same Python calls as Lightning's own
``DeepSpeedStrategy`` class (its refusal of a CPU lifted in ``tests/helpers/step_calls_run.py`` only).

Same-config GPU pairs (benchmarks/README.md) differ by up to a few percent between repeats, so a small per-step cost
would hide in them; a count of Python calls (``cProfile``) does not depend on the machine's load. Measured, per
step of the tiny GPT-2 through either class: 8,820 under ``zero2``, 12,101 with activation checkpointing, 57,214
under ``zero3`` and 9,808 under ``zero2`` with the optimizer on the CPU (DeepSpeed's CPU Adam on both sides).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.launch import run_script

pytestmark = pytest.mark.multiprocess  # every test here starts processes

RUNNER = Path(__file__).parent / "helpers" / "step_calls_run.py"


@pytest.fixture(scope="module")
def counts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, float]:
    out = tmp_path_factory.mktemp("step_calls") / "counts.json"
    run_script(RUNNER, str(out), timeout=300)
    return dict(json.loads(out.read_text()))


def test_a_step_makes_the_same_python_calls_as_under_lightnings_deepspeed_strategy(counts: dict[str, float]) -> None:
    for config in ("", "+ac", "+zero3", "+offload"):
        assert counts[f"ours{config}"] == counts[f"lightning{config}"], config


def test_the_count_sees_the_step(counts: dict[str, float]) -> None:
    assert counts["lightning+ac"] > counts["lightning"] > 1000  # recomputation adds calls: the steps were profiled
    assert counts["lightning+zero3"] > counts["lightning+ac"]  # ZeRO-3 gathers each module's parameters
    assert counts["lightning+offload"] != counts["lightning"]  # the CPU optimizer's step replaced the GPU one
