"""One ZeRO config, three backends: DeepSpeed (zero2), FairScale (zero2_fairscale), FSDP2 (zero2_fsdp).

examples/backend_switch.yaml holds one ``zero`` mapping; each backend's strategy class takes it unchanged, both
in Python and through LightningCLI's ``class_path``/``init_args``.

Tolerance: the three ZeRO-2 implementations do DDP's float32 arithmetic on 2 processes, and were measured
bit-identical to DDP and to each other over 12 steps of the tiny GPT-2; we allow float32 round-off, 1e-6.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from lightning.pytorch.cli import LightningCLI

from lightning_zero import DeepSpeedZeroConfig, ZeroConfig
from lightning_zero.strategies.fairscale_config import FairScaleZeroConfig
from lightning_zero.strategies.fsdp2_config import FSDP2ZeroConfig
from tests.helpers.backend_runs import SWITCH_CONFIG, result_name
from tests.helpers.runif import RunIf
from tests.helpers.shared_launch import STEPS, SharedLaunch
from tests.helpers.tiny import TinyLM

BACKENDS: dict[str, type[ZeroConfig]] = {
    "lightning_zero.strategies.deepspeed.ZeroStrategy": DeepSpeedZeroConfig,
    "lightning_zero.strategies.fairscale.FairScaleStrategy": FairScaleZeroConfig,
    "lightning_zero.strategies.fsdp2.FSDP2Strategy": FSDP2ZeroConfig,
}
TOLERANCE = 1e-6
pytestmark = RunIf(fairscale=True)  # one of the three backends


BACKEND_RUNS = ["train:ddp", *(f"switch:{b}" for b in BACKENDS)]


@pytest.fixture(scope="module")
def runs(backend_launch: SharedLaunch) -> Path:
    """Where this module's runs wrote their results (a launch shared with other modules: tests/conftest.py)."""
    return backend_launch.out


def load(out: Path, run: str) -> dict:
    return torch.load(out / f"{result_name(run)}.pt", weights_only=False)


def test_the_config_is_shared() -> None:
    zero = yaml.safe_load(SWITCH_CONFIG.read_text())["zero"]
    assert zero["stage"] == 2
    for config_class in BACKENDS.values():
        assert config_class.from_dict(zero).stage == 2


@pytest.mark.multiprocess
@pytest.mark.parametrize("backend", BACKENDS)
def test_each_backend_follows_the_same_loss_curve(runs: Path, backend: str) -> None:
    reference, result = load(runs, "train:ddp"), load(runs, f"switch:{backend}")
    assert len(result["losses"]) == STEPS
    torch.testing.assert_close(
        torch.tensor(result["losses"]), torch.tensor(reference["losses"]), atol=TOLERANCE, rtol=0
    )
    for key, value in reference["state_dict"].items():
        torch.testing.assert_close(result["state_dict"][key], value, atol=TOLERANCE, rtol=0)


@pytest.mark.multiprocess
def test_backends_shard_what_their_stage_says(runs: Path) -> None:
    ddp = load(runs, "train:ddp")["footprints"][0]
    fairscale = load(runs, "switch:lightning_zero.strategies.fairscale.FairScaleStrategy")["footprints"]
    fsdp2 = load(runs, "switch:lightning_zero.strategies.fsdp2.FSDP2Strategy")["footprints"]
    assert sum(rank[2] for rank in fairscale) == ddp[2] and all(rank[0] == ddp[0] for rank in fairscale)
    assert sum(rank[0] for rank in fsdp2) == ddp[0] and sum(rank[2] for rank in fsdp2) == ddp[2]


@pytest.mark.parametrize("class_path", BACKENDS)
def test_lightning_cli_builds_each_backend_from_class_path_and_init_args(class_path: str, tmp_path: Path) -> None:
    zero = yaml.safe_load(SWITCH_CONFIG.read_text())["zero"]
    config = {
        "trainer": {
            "accelerator": "cpu",
            "devices": 2,
            "logger": False,
            "strategy": {"class_path": class_path, "init_args": {"zero": zero}},
        },
        "model": {"lr": 0.01},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    cli = LightningCLI(TinyLM, run=False, args=["--config", str(path)], save_config_callback=None)
    strategy: Any = cli.trainer.strategy
    module_name, class_name = class_path.rsplit(".", 1)
    assert type(strategy) is getattr(importlib.import_module(module_name), class_name)  # ZeroStrategy is an alias
    assert isinstance(strategy.zero, BACKENDS[class_path])
    assert strategy.zero.stage == 2
