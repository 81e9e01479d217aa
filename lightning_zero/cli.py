"""The command line: LightningCLI over the task modules, with every lightning-zero preset known by name.

    python main.py fit --config configs/quickstart.yaml
    lightning-zero fit --config configs/deberta.yaml --trainer.strategy zero3_offload
    lightning-zero chat --checkpoint runs/chatbot/last.ckpt
    lightning-zero strategies
    lightning-zero build-ops

``trainer.strategy`` takes a short name (``zero2``, ``zero3_offload``, ...) or ``class_path`` + ``init_args``.
Bad configuration ends with one ``error:`` line that names the fix, not a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from lightning.pytorch.cli import LightningCLI

import lightning_zero  # noqa: F401  (registers the presets before the Trainer is built)
from lightning_zero.errors import ZeroConfigError
from lightning_zero.strategies.presets import PRESETS, check_strategy_name


class ZeroCLI(LightningCLI):
    """LightningCLI that checks short strategy names before anything is built."""

    def before_instantiate_classes(self) -> None:
        strategy = self._active_config().get("trainer", {}).get("strategy")
        if isinstance(strategy, str):
            check_strategy_name(strategy)

    def _active_config(self) -> Any:
        return self.config[self.subcommand] if self.subcommand else self.config


def run_cli(args: Sequence[str] | None = None) -> ZeroCLI:
    """Parse ``args`` (``sys.argv`` by default) and run the subcommand."""
    return ZeroCLI(
        subclass_mode_model=True,
        subclass_mode_data=True,
        save_config_kwargs={"overwrite": True},
        args=list(args) if args is not None else None,
    )


def list_strategies() -> str:
    """A table of the presets: name, backend and what it does."""
    width = max(len(preset.name) for preset in PRESETS)
    return "\n".join(f"{preset.name:<{width}}  {preset.backend:<9}  {preset.description}" for preset in PRESETS)


def build_deepspeed_cpu_ops() -> None:
    """Compile DeepSpeed's CPU ops now (shared-memory collectives, CPU Adam) instead of in the first run."""
    from deepspeed.accelerator import get_accelerator

    for builder in ("ShareMemCommBuilder", "CPUAdamBuilder"):
        op_builder = get_accelerator().create_op_builder(builder)
        if op_builder is not None and op_builder.is_compatible():
            op_builder.load()
            print(f"built {builder}")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``lightning-zero`` and ``main.py``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["strategies"]:
            print(list_strategies())
            return 0
        if argv[:1] == ["build-ops"]:
            build_deepspeed_cpu_ops()
            return 0
        if argv[:1] == ["chat"]:
            from lightning_zero.chat import main as chat_main

            return chat_main(argv[1:])
        run_cli(argv)
    except ZeroConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0
