"""The library installs alone: the strategies train a plain ``nn.Module`` where the ``app`` extra (transformers,
tensorboard, sacrebleu) and the other optional packages are not installed, and the app's commands say what to
install in one line (helpers/without_app.py makes them look not installed)."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import lightning.fabric.loggers.tensorboard
import pytest

from lightning_zero.app.cli import main
from lightning_zero.packages import APP_PACKAGES, INSTALL_APP
from tests.helpers.launch import REPO, run_script, side_by_side
from tests.helpers.without_app import HIDDEN

RUNNER = Path(__file__).parent / "helpers" / "alone_run.py"
WITHOUT_APP = Path(__file__).parent / "helpers" / "without_app.py"
STRATEGIES = ("zero2", "zero3")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("alone")
    run_script(RUNNER, str(out), *STRATEGIES, timeout=300)
    return out


def both_ranks(out: Path, strategy: str) -> list[dict[str, Any]]:
    return [json.loads((out / f"{strategy}-rank{rank}.json").read_text()) for rank in (0, 1)]


def requirement_names(pyproject: str, list_name: str) -> set[str]:
    """The package names of the list ``list_name = [...]`` of ``pyproject.toml`` (no tomllib on Python 3.10)."""
    block = re.search(rf"^{re.escape(list_name)} = \[(.*?)^\]", pyproject, re.MULTILINE | re.DOTALL)
    assert block is not None, list_name
    return set(re.findall(r'^\s*"([\w-]+)', block.group(1), re.MULTILINE))


def test_the_base_install_has_none_of_the_app_packages() -> None:
    pyproject = (REPO / "pyproject.toml").read_text()
    base = requirement_names(pyproject, "dependencies")
    assert {"torch", "lightning", "deepspeed", "torchmetrics", "jsonargparse"} <= base
    assert base & APP_PACKAGES == set()
    assert requirement_names(pyproject, "app") == APP_PACKAGES
    assert APP_PACKAGES <= HIDDEN


@pytest.mark.multiprocess
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_preset_trains_a_plain_module_without_the_app_packages(runs: Path, strategy: str) -> None:
    for result in both_ranks(runs, strategy):
        assert result["importable"] == [], "the packages were not hidden: the test proves nothing"
        assert result["imported"] == []
        losses = result["losses"]
        # The same four samples at every step with AdamW(lr=1e-3): each step lowers the loss.
        assert len(losses) == 6
        assert all(after < before for before, after in itertools.pairwise(losses)), losses


APP_COMMANDS = {
    "chat": ["chat", "--checkpoint", "x.ckpt"],
    "fit": ["fit", "--config", str(REPO / "configs" / "quickstart.yaml")],
    "plan": ["plan", "--config", str(REPO / "configs" / "quickstart.yaml")],
}


def without_app(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(WITHOUT_APP), *argv], cwd=REPO, capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module")
def commands_without_app() -> dict[str, subprocess.CompletedProcess[str]]:
    """Each of :data:`APP_COMMANDS` and ``--help`` run with the app packages hidden, two at a time (each is one
    process that mostly imports, so the two cores run two side by side)."""
    argvs = {**APP_COMMANDS, "help": ["--help"]}
    return side_by_side(without_app, argvs, at_once=2)


@pytest.mark.multiprocess
@pytest.mark.parametrize("command", list(APP_COMMANDS))
def test_an_app_command_without_the_app_extra_names_the_install(
    commands_without_app: dict[str, subprocess.CompletedProcess[str]], command: str
) -> None:
    result = commands_without_app[command]
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "'transformers'" in last and last.endswith(f"`{INSTALL_APP}`."), last


@pytest.mark.multiprocess
def test_help_lists_every_command_without_the_app_extra(
    commands_without_app: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    result = commands_without_app["help"]
    assert result.returncode == 0, result.stderr[-2000:]
    assert "chat" in result.stdout and INSTALL_APP in result.stdout, result.stdout[-2000:]


def test_the_tensorboard_logger_without_tensorboard_names_the_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(lightning.fabric.loggers.tensorboard, "_TENSORBOARD_AVAILABLE", False)
    monkeypatch.setattr(lightning.fabric.loggers.tensorboard, "_TENSORBOARDX_AVAILABLE", False)
    one_process = ["--trainer.devices=1", "--trainer.strategy=auto"]  # the logger fails as the Trainer is built
    assert main(["fit", "--config", str(REPO / "configs" / "quickstart.yaml"), *one_process]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == f"error: The TensorBoard logger needs 'tensorboard', which is not installed: run `{INSTALL_APP}`."
