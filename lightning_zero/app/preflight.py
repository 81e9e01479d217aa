"""Checks and defaults applied to a parsed trainer config before anything is built or launched.

Bad input found here is a :class:`~lightning_zero.errors.ZeroConfigError` in the launching process, before
any rank starts, instead of a traceback from inside Lightning, DeepSpeed or a rank.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
import yaml
from lightning.pytorch.utilities import rank_zero_info

from lightning_zero.errors import ZeroConfigError
from lightning_zero.hardware import cpu_precision
from lightning_zero.strategies.launch_checks import check_deepspeed_trainer, check_zero_trainer

_DEVICES_TEXT = re.compile(r"auto|-1|\d+|\d+(\s*,\s*\d+)*,?")


def default_cpu_precision(trainer: Any) -> None:
    """Fill ``trainer.precision`` for a CPU run that leaves it unset, and say which precision and why, once."""
    if trainer.get("precision") is not None or not runs_on_cpu(trainer.get("accelerator")):
        return
    choice = cpu_precision()
    trainer["precision"] = choice.precision
    rank_zero_info(f"Precision {choice.precision}: {choice.reason}. Set `trainer.precision` to choose another.")


def runs_on_cpu(accelerator: Any) -> bool:
    """Whether a trainer ``accelerator`` value (a name, ``None``, or a ``class_path`` namespace) means the CPU."""
    if accelerator is None or accelerator == "auto":
        return not (torch.cuda.is_available() or torch.backends.mps.is_available())
    if isinstance(accelerator, str):
        return accelerator == "cpu"
    class_path = getattr(accelerator, "class_path", "")
    return isinstance(class_path, str) and class_path.endswith("CPUAccelerator")


def check_trainer_config(trainer: Any) -> None:
    """Raise on trainer values Lightning would reject with a traceback, or only after the ranks started."""
    _check_devices(trainer.get("devices"))
    _check_accelerator_available(trainer.get("accelerator"))
    _check_at_least("num_nodes", trainer.get("num_nodes"), 1, "the number of machines")
    _check_at_least("accumulate_grad_batches", trainer.get("accumulate_grad_batches"), 1, "batches per optimizer step")
    _check_at_least("max_steps", trainer.get("max_steps"), -1, "-1 for no limit")
    _check_positive_interval(trainer.get("val_check_interval"))
    clip = trainer.get("gradient_clip_val")
    if isinstance(clip, (int, float)) and clip < 0:
        raise ZeroConfigError(f"`trainer.gradient_clip_val` is {clip}: give 0 or more (null or 0: no clipping).")
    _check_cpu_strategy(trainer.get("strategy"), trainer.get("accelerator"))


def check_before_launch(trainer: Any, model: Any, datamodule: Any) -> None:
    """Checks that need the built objects, made in the launching process before any rank starts."""
    check_built_trainer(trainer)
    check_model_sources(model, datamodule)
    check_data_files(datamodule)


def check_data_files(datamodule: Any) -> None:
    """Every ``*_file`` hyper-parameter of the data module names an existing file, and a data module that reads
    files (``check_files``) reads them here, before any rank starts."""
    hparams = getattr(datamodule, "hparams", None) or {}
    for key, value in hparams.items():
        if key.endswith("_file") and isinstance(value, str) and Path(value).expanduser().is_dir():
            raise ZeroConfigError(f"`data.{key}` {value!r} is a directory: name a data file in it.")
        if key.endswith("_file") and isinstance(value, str) and not Path(value).expanduser().is_file():
            raise ZeroConfigError(f"`data.{key}` {value!r} does not exist: check the path.")
    check_files = getattr(datamodule, "check_files", None)
    if callable(check_files):
        check_files()


def check_model_sources(*modules: Any) -> None:
    """The ``model`` and ``tokenizer`` names in the modules' hyper-parameters must be loadable."""
    from lightning_zero.app.models.availability import check_loadable

    for module in modules:
        hparams = getattr(module, "hparams", None) or {}
        for key in ("model", "tokenizer"):
            name = hparams.get(key)
            if isinstance(name, str):
                check_loadable(name, what=key)


def check_built_trainer(trainer: Any) -> None:
    """Checks that need the built Trainer, made by the CLI (:class:`~lightning_zero.strategies.launch_checks.
    PreflightLauncher` makes the DeepSpeed ones for a Trainer built in Python)."""
    from lightning.pytorch.accelerators import CPUAccelerator
    from lightning.pytorch.strategies import DeepSpeedStrategy

    from lightning_zero.strategies.deepspeed import ZeroStrategy

    if trainer is None:
        return
    strategy = trainer.strategy
    if isinstance(strategy, ZeroStrategy):
        check_zero_trainer(trainer)
    elif isinstance(strategy, DeepSpeedStrategy):
        if isinstance(trainer.accelerator, CPUAccelerator):
            raise ZeroConfigError(
                "Lightning's own DeepSpeed strategies run only on CUDA GPUs: on CPU use a lightning-zero preset "
                "(`--trainer.strategy zero2`, `zero3`, `zero2_offload`, ...; `lightning-zero strategies` lists them)."
            )
        check_deepspeed_trainer(None, trainer)


def _check_devices(devices: Any) -> None:
    if isinstance(devices, int) and not isinstance(devices, bool) and devices < 1 and devices != -1:
        raise ZeroConfigError(
            f"`trainer.devices` is {devices}: give a number of devices of at least 1, a list of device indices, "
            "-1 for all, or 'auto'."
        )
    if (isinstance(devices, str) and not _DEVICES_TEXT.fullmatch(devices.strip())) or devices in ("0", ""):
        raise ZeroConfigError(
            f"`trainer.devices` is {devices!r}: give a number of devices of at least 1, a list of device indices, "
            "-1 for all, or 'auto'."
        )
    if isinstance(devices, (list, tuple)) and not devices:
        raise ZeroConfigError("`trainer.devices` is an empty list: list at least one device index, or give a count.")


def _check_accelerator_available(accelerator: Any) -> None:
    from lightning.pytorch.accelerators import AcceleratorRegistry

    names = sorted({*AcceleratorRegistry.available_accelerators(), "auto", "gpu"})
    if isinstance(accelerator, str) and accelerator not in names:
        raise ZeroConfigError(f"Unknown `trainer.accelerator` {accelerator!r}: use one of {', '.join(names)}.")
    if accelerator == "tpu" and not AcceleratorRegistry["tpu"]["accelerator"].is_available():
        raise ZeroConfigError("`trainer.accelerator` is 'tpu' but this machine has no TPU: use 'cpu' or 'auto'.")
    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ZeroConfigError(
            f"`trainer.accelerator` is {accelerator!r} but this machine has no CUDA GPU that torch can use: "
            "use `--trainer.accelerator cpu` (or 'auto'), or install a CUDA build of torch on a GPU machine."
        )
    if accelerator == "mps" and not torch.backends.mps.is_available():
        raise ZeroConfigError(
            "`trainer.accelerator` is 'mps' but this machine has no Apple GPU: use `--trainer.accelerator cpu`."
        )


def _check_at_least(name: str, value: Any, least: int, meaning: str) -> None:
    if isinstance(value, int) and not isinstance(value, bool) and value < least:
        raise ZeroConfigError(f"`trainer.{name}` is {value}: give {least} or more ({meaning}).")


def _check_positive_interval(interval: Any) -> None:
    if isinstance(interval, (int, float)) and not isinstance(interval, bool) and interval <= 0:
        raise ZeroConfigError(
            f"`trainer.val_check_interval` is {interval}: give a number of batches (1 or more) or a fraction of "
            "an epoch in (0, 1]."
        )


#: Lightning's strategy names that refuse a CPU, and the lightning-zero preset that does the same there.
_GPU_ONLY_STRATEGIES = {"fsdp": "zero3_fsdp", "fsdp_cpu_offload": "zero3_offload_fsdp"}


def _check_cpu_strategy(strategy: Any, accelerator: Any) -> None:
    if isinstance(strategy, str) and strategy in _GPU_ONLY_STRATEGIES and runs_on_cpu(accelerator):
        raise ZeroConfigError(
            f"Lightning's strategy {strategy!r} runs only on CUDA GPUs: on CPU use "
            f"`--trainer.strategy {_GPU_ONLY_STRATEGIES[strategy]}` (PyTorch FSDP2), or a GPU machine."
        )


#: The sections of a run config (LightningCLI's top-level keys); a file with none of them is of another kind.
RUN_SECTIONS = frozenset({"trainer", "model", "data", "seed_everything", "ckpt_path", "optimizer", "lr_scheduler"})
#: Top-level keys only a DeepSpeed config has.
_DEEPSPEED_KEYS = frozenset(
    {"zero_optimization", "train_micro_batch_size_per_gpu", "train_batch_size", "gradient_accumulation_steps"}
)
_EXAMPLE = "pass a run config with `trainer`, `model` and `data` sections, such as configs/quickstart.yaml"


def check_config_files(argv: list[str]) -> None:
    """Each ``--config`` file of ``argv`` that exists is a run config: not empty, not binary (a checkpoint), not a
    list or a line of text (a data file), not a DeepSpeed config. The parser reports missing files and bad YAML."""
    for index, argument in enumerate(argv):
        if argument == "--config" and index + 1 < len(argv):
            check_config_file(Path(argv[index + 1]))
        elif argument.startswith("--config="):
            check_config_file(Path(argument.partition("=")[2]))


def check_config_file(path: Path) -> None:
    """Raise unless ``path``, if it is a readable YAML file, holds a mapping with a run config's sections."""
    if not path.is_file():
        return
    try:
        content = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ZeroConfigError(
            f"Config file '{path}' is not text (a checkpoint goes to --ckpt_path): {_EXAMPLE}."
        ) from None
    except yaml.YAMLError:
        return
    if content is None:
        raise ZeroConfigError(f"Config file '{path}' is empty: {_EXAMPLE}.")
    if not isinstance(content, dict):
        raise ZeroConfigError(
            f"Config file '{path}' holds a {type(content).__name__}, not sections (a data file goes to"
            f" `--data.init_args.train_file`): {_EXAMPLE}."
        )
    if _DEEPSPEED_KEYS & set(content) and not RUN_SECTIONS & set(content):
        raise ZeroConfigError(
            f"Config file '{path}' is a DeepSpeed config, not a run config: give it to the strategy,"
            f" `--trainer.strategy lightning_zero.ZeroStrategy --trainer.strategy.init_args.deepspeed_config"
            f" {path.name}`."
        )
