"""The command line: LightningCLI over the task modules, with every lightning-zero preset known by name.

    python main.py fit --config configs/quickstart.yaml
    lightning-zero fit --config configs/deberta.yaml --trainer.strategy zero3_offload
    lightning-zero chat --checkpoint runs/chatbot/last.ckpt
    lightning-zero strategies
    lightning-zero build-ops
    lightning-zero --help              (every command, a line each; ``lightning-zero COMMAND --help`` for one)

``--verbose`` anywhere keeps the library warnings that are silenced by default (see :mod:`lightning_zero.quiet`).

``trainer.strategy`` takes a short name (``zero2``, ``zero3_offload``, ...) or ``class_path`` + ``init_args``.
Bad configuration ends with one ``error:`` line that names the fix, not a traceback.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import sys
from argparse import ArgumentError, RawDescriptionHelpFormatter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from jsonargparse import ArgumentParser, DefaultHelpFormatter
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.strategies import Strategy

import lightning_zero  # noqa: F401  (registers the presets before the Trainer is built)
from lightning_zero.app import preflight
from lightning_zero.app.parse_errors import as_config_error, explain, parse_error_line
from lightning_zero.checkpoint.resume import ExactResume, WeightsOnlyResume
from lightning_zero.checkpoint.validate import check_checkpoint
from lightning_zero.errors import CommandParser, LightningZeroError, ZeroConfigError
from lightning_zero.internals import subcommand_parsers
from lightning_zero.packages import app_extra_error, missing_app_package
from lightning_zero.presets import PRESETS, check_strategy_name
from lightning_zero.quiet import quiet_libraries

#: Arguments the task and its data module must agree on: the data module's value is the task's.
#: Not ``num_labels``: an instantiate link overrides a given ``model.init_args.num_labels`` silently, and files
#: without label_names or ``datasets`` data know their classes only once read (setup), so the task checks them there.
SHARED_ARGUMENTS = ("tokenizer", "tokenizer_cache_dir", "max_target_length")


class ZeroCLI(LightningCLI):
    """LightningCLI that checks short strategy names before anything is built, and gives the task the data
    module's tokenizer (and the other :data:`SHARED_ARGUMENTS`), so a config names them once, under ``data``."""

    def add_arguments_to_parser(self, parser: Any) -> None:
        for name in SHARED_ARGUMENTS:
            parser.link_arguments(f"data.init_args.{name}", f"model.init_args.{name}")

    def before_instantiate_classes(self) -> None:
        trainer = self._active_config().get("trainer", {})
        preflight.check_trainer_config(trainer)
        preflight.default_cpu_precision(trainer)
        strategy = trainer.get("strategy")
        if isinstance(strategy, str):
            if Path(strategy).is_file():
                raise ZeroConfigError(f"Strategy config {strategy!r}: {_why_not_a_strategy(strategy)}")
            check_strategy_name(strategy)

    def before_fit(self) -> None:
        check_checkpoint(self._ckpt_path(), self.model)

    def instantiate_classes(self) -> None:
        super().instantiate_classes()
        preflight.check_before_launch(self.trainer, self.model, self.datamodule)

    def parse_arguments(self, parser: Any, args: Any) -> None:
        _raise_instead_of_exit(parser)
        try:
            super().parse_arguments(parser, args)
        except ArgumentError as error:
            raise ZeroConfigError(parse_error_line(str(error))) from None
        check_checkpoint(self._ckpt_path())

    def _ckpt_path(self) -> Any:
        subcommand = self.config.get("subcommand")
        return self.config[subcommand].get("ckpt_path") if subcommand else None

    def _parse_ckpt_path(self) -> None:
        # LightningCLI reads the checkpoint's hyper-parameters into the model's config here.
        try:
            super()._parse_ckpt_path()
        except ArgumentError as error:
            raise ZeroConfigError(
                f"Checkpoint '{self._ckpt_path()}' was saved with hyper-parameters that this model config does not take"
                f" ({parse_error_line(str(error))}): pass a checkpoint of this model."
            ) from None

    def _active_config(self) -> Any:
        return self.config[self.subcommand] if self.subcommand else self.config


def _raise_instead_of_exit(parser: Any) -> None:
    parser.exit_on_error = False
    for subparser in subcommand_parsers(parser):
        _raise_instead_of_exit(subparser)


def _why_not_a_strategy(path: str) -> str:
    """Why jsonargparse could not read ``path`` as a strategy (it then falls back to taking it as a name)."""
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--strategy", type=Strategy)
    try:
        parser.parse_object({"strategy": yaml.safe_load(Path(path).read_text())})
    except (ArgumentError, yaml.YAMLError) as error:
        return explain(str(error), drop_keys=("strategy",))
    return "not a strategy name, nor a class_path + init_args file."


#: The first lines of ``lightning-zero --help``.
DESCRIPTION = (
    "ZeRO sharding and CPU offload for PyTorch Lightning.\n"
    "Commands: fit, validate, test, predict (below), and the others listed at the end."
)


class _HelpFormatter(RawDescriptionHelpFormatter, DefaultHelpFormatter):
    """jsonargparse's help, keeping the line breaks of the list of commands that ends it."""


def run_cli(args: Sequence[str] | None = None) -> ZeroCLI:
    """Parse ``args`` (``sys.argv`` by default) and run the subcommand; an error about the user's input, from
    building the objects or from Lightning's checks when the run starts, becomes one :class:`ZeroConfigError`."""
    argv = list(sys.argv[1:] if args is None else args)
    # The list of commands imports each command's module for its description: only for a help page.
    epilog = commands_help() if {"-h", "--help"} & set(argv) else None
    try:
        return ZeroCLI(
            subclass_mode_model=True,
            subclass_mode_data=True,
            save_config_kwargs={"overwrite": True},
            parser_kwargs={"description": DESCRIPTION, "epilog": epilog, "formatter_class": _HelpFormatter},
            trainer_defaults={"callbacks": [ExactResume(), WeightsOnlyResume()]},
            args=list(args) if args is not None else None,
        )
    except (ValueError, TypeError, ImportError, MisconfigurationException) as error:
        cause = as_config_error(error)
        if cause is None:
            raise
        raise cause from None


def list_strategies() -> str:
    """A table of the presets: name, backend and what it does."""
    width = max(len(preset.name) for preset in PRESETS)
    return "\n".join(f"{preset.name:<{width}}  {preset.backend:<9}  {preset.description}" for preset in PRESETS)


@dataclass(frozen=True)
class Command:
    """A command besides LightningCLI's, imported only when used: each is ``module:function``."""

    #: Takes the remaining arguments; returns the exit status.
    run: str
    #: Returns the command's argument parser, whose description is the command's line in ``lightning-zero --help``.
    parser: str


#: The commands besides LightningCLI's (fit, validate, test, predict).
SUBCOMMANDS = {
    "plan": Command("lightning_zero.app.plan_command:main", "lightning_zero.app.plan_command:build_parser"),
    "consolidate": Command("lightning_zero.app.consolidate:main", "lightning_zero.app.consolidate:build_parser"),
    "strategies": Command("lightning_zero.app.cli:strategies_command", "lightning_zero.app.cli:strategies_parser"),
    "chat": Command("lightning_zero.app.chat:main", "lightning_zero.app.chat:build_parser"),
    "build-ops": Command("lightning_zero.app.cli:build_ops_command", "lightning_zero.app.cli:build_ops_parser"),
}


def strategies_parser() -> argparse.ArgumentParser:
    """The ``strategies`` command's parser (no options)."""
    return CommandParser(
        prog="lightning-zero strategies", description="List the strategy presets: name, backend and what each does."
    )


def strategies_command(argv: Sequence[str]) -> int:
    """``lightning-zero strategies``: print the preset table."""
    strategies_parser().parse_args(list(argv))
    print(list_strategies())
    return 0


def build_ops_parser() -> argparse.ArgumentParser:
    """The ``build-ops`` command's parser (no options)."""
    return CommandParser(
        prog="lightning-zero build-ops",
        description="Compile DeepSpeed's CPU ops (CPU Adam, shared memory) now instead of in the first run.",
    )


def build_ops_command(argv: Sequence[str]) -> int:
    """``lightning-zero build-ops``: compile DeepSpeed's CPU ops now, not in the first run."""
    build_ops_parser().parse_args(list(argv))
    from lightning_zero.runtime.ops import build_cpu_ops

    failures = build_cpu_ops()
    for failure in failures:
        print(f"error: {failure}", file=sys.stderr)
    return 1 if failures else 0


def _load(target: str) -> Any:
    """The function ``module:function``; a command whose module needs the ``app`` extra, when it is not
    installed, is one error line naming the install."""
    module_name, function = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        package = missing_app_package(error.name)
        if package is None:
            raise
        command = next(name for name, known in SUBCOMMANDS.items() if target in (known.run, known.parser))
        raise app_extra_error(package, f"`lightning-zero {command}`") from None
    return getattr(module, function)


def commands_help() -> str:
    """The end of ``lightning-zero --help``: each command besides LightningCLI's, described by its own parser."""
    width = max(len(name) for name in SUBCOMMANDS)
    lines = [f"  {name:<{width}}  {_description(command)}" for name, command in SUBCOMMANDS.items()]
    return "\n".join(["other commands (`lightning-zero COMMAND --help` describes each):", *lines])


def _description(command: Command) -> str:
    try:
        description: str = _load(command.parser)().description
    except ZeroConfigError as error:
        return f"(not available: {error})"
    return description


def check_command(argv: Sequence[str]) -> None:
    """Raise when ``argv`` names no command, or one that does not exist (LightningCLI knows only its own)."""
    commands = [*ZeroCLI.subcommands(), *SUBCOMMANDS]
    if not argv:
        raise ZeroConfigError(f"No command given: use one of {', '.join(commands)} (`lightning-zero --help`).")
    name = argv[0]
    if name.startswith("-") or name in commands:
        return
    close = difflib.get_close_matches(name, commands, n=1)
    guess = f"did you mean {close[0]!r}? " if close else ""
    raise ZeroConfigError(f"Unknown command {name!r}: {guess}The commands are {', '.join(commands)} (`--help`).")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``lightning-zero`` and ``main.py``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = "--verbose" in argv
    argv = [arg for arg in argv if arg != "--verbose"]
    try:
        with quiet_libraries(verbose):
            check_command(argv)
            preflight.check_config_files(argv)
            if argv[0] in SUBCOMMANDS:
                status: int = _load(SUBCOMMANDS[argv[0]].run)(argv[1:])
                return status
            run_cli(argv)
    except LightningZeroError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0
