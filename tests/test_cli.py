"""The command line: every config parses, short names need no import, every config and example runs (bad input:
tests/test_bad_input.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lightning_zero.app.cli import SUBCOMMANDS, ZeroCLI, list_strategies, main
from tests.helpers.launch import REPO, run_script

# Every YAML in configs/ is a whole LightningCLI config.
CONFIGS = sorted((REPO / "configs").glob("*.yaml"))
CPU_TWINS = [path for path in CONFIGS if path.stem.endswith("_cpu")]
MAIN = REPO / "main.py"
CONFIGS_RUN = REPO / "tests" / "helpers" / "configs_run.py"


class ParseOnlyCLI(ZeroCLI):
    """Parses and validates against the current signatures without building anything."""

    def instantiate_classes(self) -> None:
        pass


def parse(*args: str) -> ParseOnlyCLI:
    return ParseOnlyCLI(subclass_mode_model=True, subclass_mode_data=True, run=False, args=list(args))


def test_there_are_configs() -> None:
    names = {path.stem for path in CONFIGS}
    assert {
        "quickstart",
        "deberta",
        "blenderbot",
        "gpt2xl_offload",
        "t5_large",
        "t5_3b",
        "llama-3.2-3b",
        "llama-3.1-8b",
    } <= names
    assert "llama-3.2-3b_cpu" in names
    assert {f"{name}_cpu" for name in ("deberta", "blenderbot", "gpt2xl", "t5_large", "t5_3b")} <= names


@pytest.mark.parametrize("config", CONFIGS, ids=lambda path: path.stem)
def test_every_config_parses_against_current_signatures(config: Path) -> None:
    # A GPU config on a machine without one is refused before launch; parsing is what is checked here.
    on_this_machine = [] if torch.cuda.is_available() else ["--trainer.accelerator", "cpu"]
    cli = parse("--config", str(config), *on_this_machine)
    assert cli.config.trainer.strategy is not None
    assert cli.config.model.class_path.startswith("lightning_zero.")


def test_strategies_lists_every_preset(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["strategies"]) == 0
    listed = capsys.readouterr().out
    assert listed == list_strategies() + "\n"
    assert "zero3_offload" in listed and "deepspeed" in listed


COMMANDS = [*ZeroCLI.subcommands(), *SUBCOMMANDS]


def help_text(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 0
    return capsys.readouterr().out


def test_help_lists_every_command_with_a_line_each(capsys: pytest.CaptureFixture[str]) -> None:
    text = help_text(capsys, ["--help"])
    for name in COMMANDS:
        assert re.search(rf"^ +{re.escape(name)} +[A-Z]\w+", text, re.MULTILINE), name
    assert {"plan", "consolidate", "chat", "strategies", "build-ops"} <= set(COMMANDS)


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_has_its_own_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    usage = help_text(capsys, [name, "--help"]).splitlines()[0]
    assert usage.startswith("usage:") and f" {name} " in f"{usage} ", usage


@pytest.mark.multiprocess
def test_quickstart_runs_a_few_steps(tmp_path: Path) -> None:
    output = run_script(
        MAIN,
        "fit",
        "--config=configs/quickstart.yaml",
        "--trainer.max_steps=3",
        "--trainer.limit_val_batches=2",
        "--trainer.val_check_interval=3",
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.logger=false",
        "--trainer.callbacks=null",
        "--trainer.enable_checkpointing=false",
        "--data.init_args.limit_train=96",
        timeout=600,
    )
    assert "val_acc" in output
    # A short strategy name needs no import; library noise stays out by default.
    assert "`Trainer.fit` stopped: `max_steps=3` reached." in output
    assert "FutureWarning" not in output and "unable to detect" not in output


@pytest.mark.multiprocess
def test_every_cpu_twin_runs_a_few_steps(tmp_path: Path) -> None:
    overrides = [
        "--trainer.max_steps=2",
        "--trainer.limit_val_batches=1",
        "--trainer.val_check_interval=2",
        "--trainer.logger=false",
        "--trainer.callbacks=null",
        "--trainer.enable_checkpointing=false",
    ]
    output = run_script(CONFIGS_RUN, str(tmp_path), *map(str, CPU_TWINS), "--", *overrides, timeout=600)
    # Searched anywhere, not per line: the other rank's progress bar can land on the same line.
    stems = [path.stem for path in CPU_TWINS]
    started = re.findall("config: (" + "|".join(sorted(stems, key=len, reverse=True)) + ")", output)
    assert list(dict.fromkeys(started)) == stems and len(started) == 2 * len(stems)  # each rank says it starts
    assert output.count("`Trainer.fit` stopped: `max_steps=2` reached.") == len(CPU_TWINS), output[-3000:]


@pytest.mark.multiprocess
def test_example_runs(tmp_path: Path) -> None:
    output = run_script(REPO / "examples" / "zero3_offload_trainer.py", "--max-steps", "3", timeout=600, cwd=tmp_path)
    assert "zero3_offload finished" in output


@pytest.mark.multiprocess
def test_chat_answers_from_a_chatbot_checkpoint_that_fit_saved(tmp_path: Path) -> None:
    """The check that refuses other checkpoints (tests/test_bad_input.py) lets a real chatbot's through."""
    one_step = ["--trainer.devices=1", "--trainer.strategy=auto", "--trainer.max_steps=1", "--trainer.logger=false"]
    one_step += ["--trainer.precision=32-true", "--trainer.limit_val_batches=0"]
    one_step += [f"--trainer.default_root_dir={tmp_path}"]
    run_script(MAIN, "fit", "--config", str(REPO / "configs" / "blenderbot_cpu.yaml"), *one_step, timeout=300)
    (checkpoint,) = tmp_path.rglob("*.ckpt")
    chat = subprocess.run(
        [sys.executable, str(MAIN), "chat", "--checkpoint", str(checkpoint), "--max-turns=1", "--max-new-tokens=4"],
        input="hello\n",
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert chat.returncode == 0, chat.stderr[-2000:]
    assert chat.stdout.count("\n") == 1, chat.stdout  # one reply (a one-step model's may be empty)
