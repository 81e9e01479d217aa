"""lightning-zero under Lightning Fabric: every preset by name, trained like Fabric's own DDP, checkpoints shared with
the Trainer, the memory budget and one-line errors, and no orphaned ranks.

Real 2-process CPU (gloo) runs of the tiny GPT-2 in a plain Fabric loop, every strategy and round trip in one
launch (helpers/fabric_run.py). Tolerances are the Trainer's parity tests' (tests/test_parity_deepspeed.py): float32
round-off (1e-6) where the arithmetic is DDP's, DeepSpeed's CPU Adam's (1e-5 on losses, 5e-4 on weights) under
optimizer offload. Measured here over 8 steps: bit-identical for every preset but the two DeepSpeed offload ones
(loss 9.5e-7, weights 7.7e-5), and bit-identical for every round trip.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.fabric.plugins import Precision
from lightning.fabric.strategies import STRATEGY_REGISTRY

import lightning_zero
from lightning_zero import ZeroConfigError, build_fabric_preset, build_preset
from lightning_zero.app.consolidate import consolidate
from lightning_zero.fabric.deepspeed import FabricZeroStrategy
from lightning_zero.fabric.fsdp2 import FabricFSDP2Strategy
from lightning_zero.preset_table import PRESETS
from lightning_zero.runtime.watchdog import is_alive
from tests.helpers.launch import REPO, run_script, run_until_every_rank_ended
from tests.helpers.parity import load_result, max_weight_difference
from tests.helpers.tiny import TinyLM
from tests.test_parity_deepspeed import CPU_ADAM, EXACT

pytestmark = pytest.mark.multiprocess  # every test here reads a 2-process Fabric launch

RUNNER = REPO / "tests" / "helpers" / "fabric_run.py"
ORPHAN = REPO / "tests" / "helpers" / "fabric_orphan_run.py"
STEPS = 8
TOLERANCES = {
    "zero1": EXACT,
    "zero2": EXACT,
    "zero2_offload": CPU_ADAM,
    "zero3": EXACT,
    "zero3_offload": CPU_ADAM,
    "zero2_fsdp": EXACT,
    "zero3_fsdp": EXACT,
    "zero3_offload_fsdp": EXACT,
}
ROUND_TRIPS = ["zero2", "zero3"]
RESTAGE = "zero2:zero3"
REFUSED = {"zero1_fairscale": "zero1", "zero2_fairscale": "zero2", "zero_auto": "zero2_offload"}


@pytest.fixture(scope="module")
def fabric_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fabric")
    args = ["--steps", str(STEPS), "--strategies", "ddp", *TOLERANCES, "--resume", *ROUND_TRIPS, "--restage", RESTAGE]
    log = run_script(RUNNER, str(out), *args, timeout=600)
    (out / "launch.log").write_text(log)
    return out


def test_every_preset_is_registered_with_fabric() -> None:
    assert {preset.name for preset in PRESETS} <= set(STRATEGY_REGISTRY)
    lightning_zero.register_fabric_presets()  # again: our own entries are replaced, no warning, no error
    assert isinstance(STRATEGY_REGISTRY.get("zero3_offload"), FabricZeroStrategy)
    assert isinstance(STRATEGY_REGISTRY.get("zero3_fsdp"), FabricFSDP2Strategy)


@pytest.mark.parametrize("name", [preset.name for preset in PRESETS if preset.backend in ("deepspeed", "fsdp2")])
def test_a_fabric_preset_has_the_trainer_presets_settings(name: str, tmp_path: Path) -> None:
    overrides = {"nvme_path": str(tmp_path)} if "nvme" in name else {}
    fabric, trainer = build_fabric_preset(name, **overrides), build_preset(name, **overrides)
    assert fabric.zero == trainer.zero
    if trainer.zero_backend == "deepspeed":  # the same translation: one DeepSpeed config for both
        assert fabric.settings.given == trainer.settings.given


@pytest.mark.parametrize(("name", "instead"), REFUSED.items())
def test_a_preset_without_a_fabric_strategy_is_one_line_naming_another(name: str, instead: str) -> None:
    with pytest.raises(ZeroConfigError) as error:
        L.Fabric(accelerator="cpu", devices=2, strategy=name)  # before any process starts
    message = str(error.value)
    assert "\n" not in message and f"`{instead}`" in message


def test_the_memory_budget_applies_under_fabric() -> None:
    strategy = build_fabric_preset("zero2", memory_budget_gib=1e-5)
    strategy.parallel_devices = [torch.device("cpu")] * 2
    strategy.precision = Precision()
    with pytest.raises(ZeroConfigError) as error:
        strategy.prepare_module(TinyLM())
    assert "\n" not in str(error.value) and "over `memory_budget_gib: 1e-05`" in str(error.value)


def test_a_config_change_after_building_is_an_error() -> None:
    strategy = build_fabric_preset("zero2")
    with pytest.raises(ZeroConfigError, match="cannot be changed once built"):
        strategy.config["train_micro_batch_size_per_gpu"] = 8


@pytest.mark.parametrize("name", list(TOLERANCES))
def test_each_preset_trains_like_fabrics_ddp(fabric_runs: Path, name: str) -> None:
    reference, result = load_result(fabric_runs, "ddp"), load_result(fabric_runs, name)
    tolerance = TOLERANCES[name]
    assert len(result["losses"]) == len(reference["losses"]) == STEPS
    torch.testing.assert_close(
        torch.tensor(result["losses"]), torch.tensor(reference["losses"]), atol=tolerance["loss"], rtol=0
    )
    assert max_weight_difference(result["state_dict"], reference["state_dict"]) <= tolerance["weight"]
    assert max_weight_difference(result["state_dict"], TinyLM().state_dict()) > 1e-3, "weights did not train"


@pytest.mark.parametrize("name", ROUND_TRIPS)
@pytest.mark.parametrize("direction", ["fabric_to_trainer", "trainer_to_fabric"])
def test_a_checkpoint_resumes_across_fabric_and_the_trainer(fabric_runs: Path, name: str, direction: str) -> None:
    """Half the run under one, the other half under the other, through one checkpoint: the losses and weights of
    the uninterrupted run (Fabric's DDP, which every preset matches exactly)."""
    reference, result = load_result(fabric_runs, "ddp"), load_result(fabric_runs, f"{name}-{direction}")
    assert result["losses"] == reference["losses"]
    assert max_weight_difference(result["state_dict"], reference["state_dict"]) == 0


def test_a_fabric_checkpoint_resumes_at_another_stage_with_its_optimizer(fabric_runs: Path) -> None:
    first, second = RESTAGE.split(":")
    reference, result = load_result(fabric_runs, "ddp"), load_result(fabric_runs, f"{first}-to-{second}")
    assert result["losses"] == reference["losses"]
    assert max_weight_difference(result["state_dict"], reference["state_dict"]) == 0
    assert "with its optimizer state, through its universal form" in (fabric_runs / "launch.log").read_text()


def test_zero_to_fp32_and_consolidate_read_a_fabric_checkpoint(fabric_runs: Path) -> None:
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    checkpoint = fabric_runs / "zero2-fabric.ckpt"
    saved = load_result(fabric_runs, "zero2-half")["state_dict"]
    assert (checkpoint / "manifest.json").is_file()
    for state in (get_fp32_state_dict_from_zero_checkpoint(str(checkpoint)), consolidate(checkpoint)):
        assert state.keys() == saved.keys()
        assert max_weight_difference({key: value.detach() for key, value in state.items()}, saved) == 0


@pytest.mark.parametrize("strategy", ["zero2", "zero3_fsdp"])
def test_when_rank_0_is_killed_under_fabric_the_other_ends_too(strategy: str, tmp_path: Path) -> None:
    """Rank 1 is in ten minutes of work of its own when rank 0 dies: without the watchdog this fails at the
    hard timeout."""
    returncode, output = run_until_every_rank_ended([sys.executable, str(ORPHAN), str(tmp_path), strategy])
    pids = [int((tmp_path / f"pid-{rank}").read_text()) for rank in (0, 1)]
    try:
        assert (tmp_path / "failed-at").exists(), output[-4000:]
        assert not [pid for pid in pids if is_alive(pid)], "a rank outlived the run"
        assert returncode != 0
        assert output.count("error: rank 0 (pid") == 1, output[-4000:]
    finally:
        for pid in pids:
            if is_alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_the_fabric_example_fine_tunes_with_zero3_offload_and_saves_a_checkpoint(tmp_path: Path) -> None:
    example = REPO / "examples" / "fabric_finetune.py"
    output = run_script(example, "--max-steps", "3", "--limit-train", "96", timeout=600, cwd=tmp_path)
    assert "zero3_offload finished 3 steps" in output
    assert consolidate(tmp_path / "checkpoints" / "fabric_finetune.ckpt").keys()
