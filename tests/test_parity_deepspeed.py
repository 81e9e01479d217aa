"""Every DeepSpeed preset trains like Lightning's DDP and shards what it says (exact resume: test_checkpoint_runs.py).

Real 2-process CPU (gloo) runs of a tiny GPT-2, all strategies in one launch (see helpers/parity_run.py).

Tolerances. Stages 1-3 without offload do the same float32 arithmetic as DDP (measured: bit-identical over
12 steps), so we allow only float32 round-off: 1e-6. With optimizer offload the step runs in DeepSpeed's
vectorised CPU Adam, whose fused float32 maths differs from torch's AdamW in the last bits and compounds
over steps (measured over 24 steps: loss 1e-6, weights 7e-5): 1e-5 on losses, 5e-4 on weights.
``compile_blocks`` runs each block through inductor's fused kernels, whose float32 round-off differs from eager
(measured over 12 steps: loss 4.8e-7, weights 4.8e-5): the same 1e-5 and 5e-4.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import pytest
import torch

from tests.helpers.launch import run_script
from tests.helpers.parity import load_result as load
from tests.helpers.parity import max_weight_difference
from tests.helpers.runif import RunIf
from tests.helpers.shared_launch import STEPS, SharedLaunch
from tests.helpers.tiny import TinyLM, token_data

DATA = Path(__file__).parent / "data"
EXACT = {"loss": 1e-6, "weight": 1e-6}
CPU_ADAM = {"loss": 1e-5, "weight": 5e-4}
PRESETS = {"zero1": EXACT, "zero2": EXACT, "zero3": EXACT, "zero2_offload": CPU_ADAM, "zero3_offload": CPU_ADAM}
CONFIG_FILES = {"ds_no_clipping": EXACT, "ds_auto": EXACT}
COMPILED = "compiled:zero2"


NEEDS_LIBAIO = RunIf(libaio=True)
NVME = not NEEDS_LIBAIO.args[0]
NVME_PRESET = pytest.param("zero3_offload_nvme", marks=NEEDS_LIBAIO)


FILES = [f"config:{DATA / 'ds_no_clipping.json'}", f"config:{DATA / 'ds_auto.yaml'}"]
PARITY_RUNS = ["ddp", *PRESETS, *FILES, *(["nvme:nvme"] if NVME else []), COMPILED]


@pytest.fixture(scope="module")
def parity_runs(parity_launch: SharedLaunch) -> Path:
    """Where this module's runs wrote their results, with ``launch.log``: the output of those runs (the launch is
    shared with other modules: tests/conftest.py)."""
    (parity_launch.out / "launch.log").write_text(parity_launch.log(PARITY_RUNS))
    return parity_launch.out


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", [*PRESETS, *CONFIG_FILES, NVME_PRESET])
def test_losses_and_weights_match_ddp(parity_runs: Path, name: str) -> None:
    tolerance = {**PRESETS, **CONFIG_FILES, "zero3_offload_nvme": CPU_ADAM}[name]
    reference, result = load(parity_runs, "ddp"), load(parity_runs, name)
    assert len(result["losses"]) == len(reference["losses"]) == STEPS
    assert result["batch_fingerprints"] == reference["batch_fingerprints"]
    torch.testing.assert_close(result["losses"], reference["losses"], atol=tolerance["loss"], rtol=0)
    assert max_weight_difference(result["state_dict"], reference["state_dict"]) <= tolerance["weight"]
    assert max_weight_difference(result["state_dict"], TinyLM().state_dict()) > 1e-3, "weights did not train"


@pytest.mark.multiprocess
def test_compiled_blocks_train_like_ddp(parity_runs: Path) -> None:
    assert "torch.compile on 2 transformer blocks." in (parity_runs / "launch.log").read_text()
    reference, result = load(parity_runs, "ddp"), load(parity_runs, "zero2_compiled")
    torch.testing.assert_close(result["losses"], reference["losses"], atol=CPU_ADAM["loss"], rtol=0)
    difference = max_weight_difference(result["state_dict"], reference["state_dict"])
    assert 0 < difference <= CPU_ADAM["weight"]  # not bit-identical: the compiled kernels ran


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", ["zero3", "zero3_offload"])
def test_a_finished_zero3_run_leaves_none_of_its_modules_to_deepspeed(parity_runs: Path, name: str) -> None:
    # ZeRO-3 keeps each engine's root module on a module-level stack that `engine.destroy()` leaves in place.
    assert load(parity_runs, name)["zero3_modules_left"] == 0


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", ["ddp", *PRESETS, "zero2_compiled"])
def test_a_finished_run_lets_its_model_and_optimizer_be_freed(parity_runs: Path, name: str) -> None:
    # Once the Trainer and module are dropped, nothing may hold the model: ZeRO's gradient hooks did, through
    # torch's C++ hook table, until the strategy's teardown released them (DDP's result shows the check can pass).
    assert load(parity_runs, name)["module_freed"]


def test_parity_would_catch_deepspeed_default_clipping() -> None:
    # DeepSpeed clips to norm 1.0 unless told otherwise; that only shows in parity if gradients exceed it.
    module = TinyLM()
    module(token_data().tensors[0][:8]).backward()
    norm = torch.nn.utils.get_total_norm(cast(list[torch.Tensor], [p.grad for p in module.parameters()]))
    assert norm > 1.0


def footprints(directory: Path, name: str) -> list[tuple[int, int, int]]:
    return [tuple(rank) for rank in load(directory, name)["footprints"]]


@pytest.mark.multiprocess
def test_ddp_holds_everything_on_every_rank(parity_runs: Path) -> None:
    for local, full, optimizer_state in footprints(parity_runs, "ddp"):
        assert local == full
        assert optimizer_state == 2 * full  # Adam's two moments


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", ["zero1", "zero2", "zero2_offload", "zero3", "zero3_offload", NVME_PRESET])
def test_optimizer_state_is_partitioned(parity_runs: Path, name: str) -> None:
    ranks = footprints(parity_runs, name)
    full = ranks[0][1]
    for _, _, optimizer_state in ranks:
        assert optimizer_state <= 0.55 * 2 * full
    assert sum(rank[2] for rank in ranks) >= 2 * full


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    ("name", "sharded"),
    [
        ("zero2", False),
        ("zero3", True),
        ("zero3_offload", True),
        pytest.param("zero3_offload_nvme", True, marks=NEEDS_LIBAIO),
    ],
)
def test_parameters_are_partitioned_only_under_stage_3(parity_runs: Path, name: str, sharded: bool) -> None:
    ranks = footprints(parity_runs, name)
    for local, full, _ in ranks:
        assert (local <= 0.55 * full) if sharded else (local == full)
    assert sum(rank[0] for rank in ranks) >= ranks[0][1]


@pytest.mark.multiprocess
def test_zero3_builds_configure_model_partitioned_with_hugging_face_init(tmp_path: Path) -> None:
    # transformers must be told that ZeRO-3 is on, or its weight init runs on empty partitions and the
    # model keeps torch's default init (std ~0.1 here instead of 0.02).
    out = tmp_path / "zero3.json"
    run_script(Path(__file__).parent / "helpers" / "sharded_init_run.py", str(out), "zero3", timeout=600)
    result = json.loads(out.read_text())
    assert result["partitioned"]
    assert 0.015 < result["std"] < 0.03
