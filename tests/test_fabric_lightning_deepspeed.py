"""Lightning's own Fabric DeepSpeed tests (``tests/tests_fabric/strategies/test_deepspeed.py`` of Lightning 2.6.5),
run against :class:`~lightning_zero.fabric.deepspeed.FabricZeroStrategy` where they apply on CPU.

Each test names the upstream test it adapts; where our strategy behaves otherwise on purpose, the test holds it to
our behaviour and docs/fabric.md lists the difference. Upstream tests that configure the strategy through Lightning's
keyword arguments (activation checkpointing, offload flags, ``exclude_frozen_parameters``) or mock DeepSpeed's engine
inside a save have no counterpart: our settings are the typed config, and our saves run the real engine (tested in
test_fabric.py's 2-process runs).
"""

from __future__ import annotations

import json
from pathlib import Path
from unittest.mock import Mock

import pytest
import torch

import lightning_zero  # noqa: F401  (registers the presets)
from lightning_zero import ZeroConfigError, build_fabric_preset, build_preset
from lightning_zero.fabric.deepspeed import FabricZeroStrategy

pytestmark = pytest.mark.slow  # each test builds a DeepSpeed engine under Fabric

DEEPSPEED_CONFIG = {
    "optimizer": {"type": "SGD", "params": {"lr": 3e-5}},
    "scheduler": {
        "type": "WarmupLR",
        "params": {"last_batch_iteration": -1, "warmup_min_lr": 0, "warmup_max_lr": 3e-5, "warmup_num_steps": 100},
    },
}


def test_deepspeed_with_invalid_config_path() -> None:
    # Upstream: FileNotFoundError. Ours: one line naming the fix.
    with pytest.raises(ZeroConfigError, match=r"'invalid_path\.json' does not exist: pass an existing JSON or YAML"):
        FabricZeroStrategy(deepspeed_config="invalid_path.json")


def test_deepspeed_with_env_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config_path = tmp_path / "temp.json"
    config_path.write_text(json.dumps(DEEPSPEED_CONFIG))
    monkeypatch.setenv("PL_DEEPSPEED_CONFIG_PATH", str(config_path))
    assert FabricZeroStrategy().config == DEEPSPEED_CONFIG
    # Ours: given `zero` settings (a preset), the variable is not read (one warning says so).
    with pytest.warns(UserWarning, match="is set but not read"):
        assert "optimizer" not in build_fabric_preset("zero2").config


def test_deepspeed_defaults() -> None:
    strategy = FabricZeroStrategy()
    assert isinstance(strategy.config["zero_optimization"], dict)
    assert strategy.config["zero_optimization"]["stage"] == 2  # Lightning's default stage too


def test_deepspeed_config_zero_offload() -> None:
    # Upstream sets offload through keyword arguments; ours through the preset, the Trainer preset's block.
    assert "offload_optimizer" not in FabricZeroStrategy().config["zero_optimization"]
    offload = build_fabric_preset("zero2_offload").config["zero_optimization"]["offload_optimizer"]
    assert offload["device"] == "cpu"
    assert offload == build_preset("zero2_offload").config["zero_optimization"]["offload_optimizer"]


def test_deepspeed_requires_joint_setup() -> None:
    with pytest.raises(NotImplementedError, match="does not support setting up the module and optimizer"):
        FabricZeroStrategy().setup_optimizer(Mock())


def test_deepspeed_save_checkpoint_storage_options(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"save_checkpoint\(..., storage_options=...\)` is not supported"):
        FabricZeroStrategy().save_checkpoint(path=tmp_path, state={}, storage_options=Mock())


def test_deepspeed_save_filter(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="manages the state serialization internally"):
        FabricZeroStrategy().save_checkpoint(path=tmp_path, state={}, filter={})


@pytest.mark.parametrize("state", [{}, {"model": torch.nn.Linear(3, 3)}])
def test_deepspeed_save_checkpoint_one_deepspeed_engine_required(tmp_path: Path, state: dict[str, object]) -> None:
    # Upstream: ValueError "Could not find a DeepSpeed model". Ours: one line saying how to pass it.
    with pytest.raises(ZeroConfigError, match=r"holds one model set up by `fabric\.setup`, but the state has 0"):
        FabricZeroStrategy().save_checkpoint(path=tmp_path, state=state)


def test_deepspeed_load_checkpoint_no_state(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"Got DeepSpeedStrategy.load_checkpoint\(..., state=None"):
        FabricZeroStrategy().load_checkpoint(path=tmp_path, state=None)
    # Upstream: the same ValueError for `{}`. Ours: the one-line error of a state without a set-up model.
    with pytest.raises(ZeroConfigError, match="but the state has 0"):
        FabricZeroStrategy().load_checkpoint(path=tmp_path, state={})


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_deepspeed_load_checkpoint_raw_state_dict(stage: int, tmp_path: Path) -> None:
    strategy = FabricZeroStrategy(zero={"stage": stage})
    model = torch.nn.Linear(3, 3)
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0)
    torch.save(model.state_dict(), tmp_path / "model.ckpt")
    torch.save(optimizer.state_dict(), tmp_path / "optimizer.ckpt")
    new_model = torch.nn.Linear(3, 3)
    new_optimizer = torch.optim.Adam(new_model.parameters(), lr=2.0)
    strategy.load_checkpoint(tmp_path / "model.ckpt", state=new_model, strict=False)
    assert torch.equal(new_model.weight, model.weight)
    strategy.load_checkpoint(tmp_path / "optimizer.ckpt", state=new_optimizer, strict=False)
    assert new_optimizer.state_dict()["param_groups"][0]["lr"] == 1.0


def test_errors_grad_clipping() -> None:
    strategy = FabricZeroStrategy()
    message = "DeepSpeed handles gradient clipping automatically within the optimizer"
    with pytest.raises(NotImplementedError, match=message):
        strategy.clip_gradients_norm(Mock(), Mock(), Mock(), Mock(), Mock())
    with pytest.raises(NotImplementedError, match=message):
        strategy.clip_gradients_value(Mock(), Mock(), Mock())
