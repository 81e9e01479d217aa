"""The ZeRO batch-size finder: the known limit under an emulated budget, every rank stopping together, and
micro-batch x accumulation for a requested global batch, in real 2-process CPU runs (helpers/fit_run.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from lightning_zero.callbacks.batch_size import ZeroBatchSizeFinder, split_global_batch
from lightning_zero.errors import ZeroConfigError
from lightning_zero.runtime.batches import is_out_of_memory
from tests.helpers.launch import run_script

RUNNER = Path(__file__).parent / "helpers" / "fit_run.py"
SCENARIOS = ("budget", "oom", "oom_ddp", "global", "plain", "global_zero3", "plain_zero3", "over_budget")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("finder")
    run_script(RUNNER, str(out), "--scenarios", *SCENARIOS, timeout=300)
    return out


def both_ranks(out: Path, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    rank0, rank1 = (json.loads((out / f"{name}-rank{rank}.json").read_text()) for rank in (0, 1))
    return rank0, rank1


@pytest.mark.multiprocess
def test_finds_the_smaller_ranks_limit_under_an_emulated_budget(runs: Path) -> None:
    rank0, rank1 = both_ranks(runs, "budget")  # emulated budgets: 10 samples on rank 0, 6 on rank 1
    assert rank0["micro_batch"] == rank1["micro_batch"] == 6
    assert rank0["module_batch_size"] == 6 and rank0["tried"] == rank1["tried"]
    assert rank0["tried"]["7"] is False and len(rank0["losses"]) == 4  # then it trained at 6


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", ["oom", "oom_ddp"])
def test_an_out_of_memory_error_on_one_rank_stops_both(runs: Path, name: str) -> None:
    rank0, rank1 = both_ranks(runs, name)  # only rank 1 raises, above 5 samples
    assert rank0["micro_batch"] == rank1["micro_batch"] == 5
    assert rank0["tried"] == rank1["tried"] and rank0["tried"]["6"] is False


@pytest.mark.multiprocess
@pytest.mark.parametrize("suffix", ["", "_zero3"], ids=["zero2", "zero3"])
def test_global_batch_is_kept_and_trials_leave_no_trace(runs: Path, suffix: str) -> None:
    rank0, _ = both_ranks(runs, f"global{suffix}")  # 16 over 2 ranks = 8 per rank; 6 fits: 4 x 2 accumulation
    assert (rank0["micro_batch"], rank0["accumulation"], rank0["trainer_accumulation"]) == (4, 2, 2)
    plain, _ = both_ranks(runs, f"plain{suffix}")  # from scratch at batch 4 x 2: the same losses, bit for bit
    assert rank0["losses"] == plain["losses"] and len(plain["losses"]) == 8


@pytest.mark.multiprocess
def test_a_strategy_refuses_model_states_over_its_budget_on_every_rank(runs: Path) -> None:
    for rank in both_ranks(runs, "over_budget"):
        assert rank["error"] is not None and rank["error"].startswith("zero1 needs 0.01 MiB per device")
        assert "use strategy `zero" not in rank["error"] and "no layout fits on 2 device(s)" in rank["error"]


def test_search_doubles_then_bisects() -> None:
    finder = ZeroBatchSizeFinder(max_batch_size=100)
    assert finder.search(lambda size: size <= 37) == 37
    assert list(finder.tried) == [1, 2, 4, 8, 16, 32, 64, 48, 40, 36, 38, 37]
    assert ZeroBatchSizeFinder(max_batch_size=20).search(lambda size: True) == 20
    assert ZeroBatchSizeFinder(max_batch_size=20).search(lambda size: False) == 0


def test_split_global_batch() -> None:
    assert split_global_batch(512, 4, 40) == (32, 4)
    assert split_global_batch(48, 2, 100) == (24, 1)
    assert split_global_batch(14, 2, 3) == (1, 7)
    with pytest.raises(ZeroConfigError, match="not divisible by the 3 processes"):
        split_global_batch(16, 3, 8)


def test_out_of_memory_errors_are_recognised() -> None:
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory"))
    assert is_out_of_memory(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 GB"))
    assert not is_out_of_memory(RuntimeError("shape mismatch"))
