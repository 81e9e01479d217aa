"""DeepSpeed's configuration: our typed dataclass, its translation, and ``"auto"`` resolution.

Everything here is a pure function of its arguments, so it is unit-tested on CPU without DeepSpeed running.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import yaml

from lightning_zero.errors import ZeroConfigError
from lightning_zero.precision import half_dtype
from lightning_zero.strategies.config import ZeroConfig, require_existing_dir

AUTO = "auto"


#: Elements of the default reduce and all-gather buckets (stages 1-2) and of the stage-3 prefetch bucket; the memory
#: plan and zero_auto's candidates count with the same.
REDUCE_BUCKET = 200_000_000
PREFETCH_BUCKET = 50_000_000


@dataclasses.dataclass(frozen=True)
class DeepSpeedZeroConfig(ZeroConfig):
    """ZeRO through DeepSpeed. ``compile_blocks`` runs on stages 0-2 (ZeRO-3's parameter hooks run inside every
    block).

    Args:
        nvme_path: Directory for NVMe offload (must exist when an offload target is ``"nvme"``).
        pin_memory: Page-lock offloaded CPU memory, as DeepSpeed itself does by default: asynchronous host-device
            copies at full bandwidth (``benchmarks/README.md`` measures the gain). Page-locked memory cannot be
            swapped out; set ``false`` on a host short of RAM, or at the very edge of GPU memory, where pinning
            can cost the last few percent of the batch. Without a GPU nothing is pinned.
        overlap_comm: Overlap gradient reduction with the backward pass.
        contiguous_gradients: Copy gradients into one buffer as they are produced (less fragmentation).
        reduce_bucket_size: Elements reduced at a time.
        allgather_bucket_size: Elements all-gathered at a time (stages 1 and 2).
        prefetch_bucket_size: Elements of parameters fetched ahead (stage 3).
        param_persistence_threshold: Parameters smaller than this stay unpartitioned (stage 3).
        max_live_parameters: Parameters kept gathered at once before release (stage 3).
        sub_group_size: Elements per optimizer step group (bounds CPU/NVMe optimizer memory).
        offload_buffer_count: Buffers for NVMe parameter swapping.
        offload_buffer_size: Elements per NVMe parameter buffer.
        cpu_adam_for_offload: Under optimizer offload, replace a plain ``torch.optim.Adam``/``AdamW`` from
            ``configure_optimizers`` by DeepSpeed's CPU Adam with the same hyper-parameters.
        loss_scale: fp16 loss scale; 0 means dynamic.
        initial_scale_power: fp16 dynamic loss scale starts at ``2**initial_scale_power``.
        loss_scale_window: Steps without overflow before the fp16 loss scale grows.
        hysteresis: Overflows tolerated before the fp16 loss scale shrinks.
        min_loss_scale: Lowest fp16 loss scale.
        offload_ratio: Share of the optimizer states (and their step) offloaded under stage 3 with optimizer
            offload; the rest stays and steps on the accelerator (DeepSpeed's ``offload_optimizer.ratio``).
        bf16_optimizer_states: **Approximate.** Keep the master weights, gradients and Adam states of the
            offloaded optimizer in bf16 instead of fp32 (DeepSpeed's ``bf16.bf16_master_weights_and_grads`` and
            ``bf16.bf16_optimizer_states``): host memory per parameter falls from 16 to about 8 bytes, and
            updates smaller than bf16's resolution of the weight are lost. Needs optimizer offload, DeepSpeed's
            CPU Adam (``cpu_adam_for_offload``) and ``bf16-mixed``/``bf16-true`` precision.
        zenflow: **Approximate.** DeepSpeed's ZenFlow under optimizer offload: the ``zenflow_topk_ratio`` most
            important gradient columns are applied on the accelerator every step, the rest accumulate and go
            through the CPU optimizer every ``zenflow_update_interval`` steps (delayed updates, not Adam).
        zenflow_topk_ratio: Share of gradient columns updated every step (0 to 1, exclusive).
        zenflow_update_interval: Steps between the CPU optimizer's updates of the other columns (``None``:
            DeepSpeed's ``"auto"``, adapted to how the gradients change).
        zenflow_select_interval: Steps between re-selections of the important columns (``None``: DeepSpeed's
            ``"auto"``, once an epoch).
        zenflow_overlap_step: Run the CPU optimizer's step in a separate process, overlapped with the
            accelerator's next forward and backward passes.
        zenflow_full_warm_up_rounds: First steps that update every column (no selection).
    """

    nvme_path: str | None = None
    pin_memory: bool = True
    overlap_comm: bool = True
    contiguous_gradients: bool = True
    reduce_bucket_size: int = REDUCE_BUCKET
    allgather_bucket_size: int = REDUCE_BUCKET
    prefetch_bucket_size: int = PREFETCH_BUCKET
    param_persistence_threshold: int = 100_000
    max_live_parameters: int = 1_000_000_000
    sub_group_size: int = 1_000_000_000
    offload_buffer_count: int = 5
    offload_buffer_size: int = 100_000_000
    cpu_adam_for_offload: bool = True
    loss_scale: float = 0.0
    initial_scale_power: int = 16
    loss_scale_window: int = 1000
    hysteresis: int = 2
    min_loss_scale: float = 1.0
    offload_ratio: float = 1.0
    bf16_optimizer_states: bool = False
    zenflow: bool = False
    zenflow_topk_ratio: float = 0.1
    zenflow_update_interval: int | None = None
    zenflow_select_interval: int | None = None
    zenflow_overlap_step: bool = False
    zenflow_full_warm_up_rounds: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_offload_levers()
        if self.compile_blocks and self.stage == 3:
            raise ZeroConfigError(
                "`compile_blocks` is not supported under DeepSpeed's ZeRO stage 3 (its parameter hooks run inside every"
                " block): set `compile_blocks: false` or a stage of 0-2."
            )
        if "nvme" in (self.offload_optimizer, self.offload_parameters):
            require_existing_dir(self.nvme_path, "NVMe offload")

    def _check_offload_levers(self) -> None:
        offloaded = self.offload_optimizer != "none"
        if not 0.0 < self.offload_ratio <= 1.0:
            raise ZeroConfigError(f"`offload_ratio` must be in (0, 1], got {self.offload_ratio!r}: e.g. 0.5.")
        if self.offload_ratio < 1.0 and not (self.stage == 3 and offloaded):
            raise ZeroConfigError(
                "`offload_ratio` below 1 needs stage 3 with optimizer offload: set `stage: 3` and"
                " `offload_optimizer: cpu`, or `offload_ratio: 1.0`."
            )
        for lever in ("bf16_optimizer_states", "zenflow"):
            if getattr(self, lever) and not (offloaded and self.cpu_adam_for_offload):
                raise ZeroConfigError(
                    f"`{lever}` needs the optimizer offloaded and stepped by DeepSpeed's CPU Adam: set"
                    f" `offload_optimizer: cpu` (and `cpu_adam_for_offload: true`), or `{lever}: false`."
                )
        if not 0.0 < self.zenflow_topk_ratio < 1.0:
            raise ZeroConfigError(f"`zenflow_topk_ratio` must be between 0 and 1, got {self.zenflow_topk_ratio!r}.")
        for name in ("zenflow_update_interval", "zenflow_select_interval"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ZeroConfigError(f"`{name}` must be at least 1 step, got {value!r}, or null for DeepSpeed's auto.")
        if self.zenflow_full_warm_up_rounds < 0:
            raise ZeroConfigError(
                f"`zenflow_full_warm_up_rounds` must be 0 or more, got {self.zenflow_full_warm_up_rounds!r}."
            )


def zenflow_section(config: DeepSpeedZeroConfig) -> dict[str, Any]:
    """The ``zero_optimization.zenflow`` block of a DeepSpeed config for ``config``."""
    select = config.zenflow_select_interval
    return {
        "topk_ratio": config.zenflow_topk_ratio,
        "update_interval": AUTO if config.zenflow_update_interval is None else config.zenflow_update_interval,
        # DeepSpeed refuses a fixed select_interval with select_strategy "auto".
        "select_strategy": AUTO if select is None else "step",
        "select_interval": AUTO if select is None else select,
        "overlap_step": config.zenflow_overlap_step,
        "full_warm_up_rounds": config.zenflow_full_warm_up_rounds,
    }


@dataclasses.dataclass(frozen=True)
class Setting:
    """A :class:`DeepSpeedZeroConfig` field and where DeepSpeed reads it.

    Args:
        field: The typed field.
        path: Its keys in a DeepSpeed config, outermost first.
        stages: The ZeRO stages it is written at.
        needs: The offload field (``offload_optimizer``/``offload_parameters``) that must be on for it to be written.
        only_if_changed: Written only when it differs from the field's default (DeepSpeed's own default then holds).
    """

    field: str
    path: tuple[str, ...]
    stages: tuple[int, ...] = (0, 1, 2, 3)
    needs: str | None = None
    only_if_changed: bool = False


_ZERO = "zero_optimization"
_OFFLOADED_OPTIMIZER = (_ZERO, "offload_optimizer")
_OFFLOADED_PARAMETERS = (_ZERO, "offload_param")

#: Every typed field a DeepSpeed config holds as it is, written once: :func:`to_deepspeed_config` writes these and
#: :func:`zero_config_of` reads them back. The others (ZenFlow's block, bf16 states, fp16/bf16 ``enabled``) are
#: derived values, written and read next to the table.
SETTINGS: tuple[Setting, ...] = (
    Setting("stage", (_ZERO, "stage")),
    Setting("overlap_comm", (_ZERO, "overlap_comm")),
    Setting("contiguous_gradients", (_ZERO, "contiguous_gradients")),
    Setting("reduce_bucket_size", (_ZERO, "reduce_bucket_size")),
    Setting("sub_group_size", (_ZERO, "sub_group_size")),
    Setting("allgather_bucket_size", (_ZERO, "allgather_bucket_size"), stages=(1, 2)),
    Setting("prefetch_bucket_size", (_ZERO, "stage3_prefetch_bucket_size"), stages=(3,)),
    Setting("param_persistence_threshold", (_ZERO, "stage3_param_persistence_threshold"), stages=(3,)),
    Setting("max_live_parameters", (_ZERO, "stage3_max_live_parameters"), stages=(3,)),
    Setting("offload_optimizer", (*_OFFLOADED_OPTIMIZER, "device"), needs="offload_optimizer"),
    Setting("nvme_path", (*_OFFLOADED_OPTIMIZER, "nvme_path"), needs="offload_optimizer"),
    Setting("pin_memory", (*_OFFLOADED_OPTIMIZER, "pin_memory"), needs="offload_optimizer"),
    Setting("offload_ratio", (*_OFFLOADED_OPTIMIZER, "ratio"), needs="offload_optimizer", only_if_changed=True),
    Setting("offload_parameters", (*_OFFLOADED_PARAMETERS, "device"), needs="offload_parameters"),
    Setting("nvme_path", (*_OFFLOADED_PARAMETERS, "nvme_path"), needs="offload_parameters"),
    Setting("pin_memory", (*_OFFLOADED_PARAMETERS, "pin_memory"), needs="offload_parameters"),
    Setting("offload_buffer_count", (*_OFFLOADED_PARAMETERS, "buffer_count"), needs="offload_parameters"),
    Setting("offload_buffer_size", (*_OFFLOADED_PARAMETERS, "buffer_size"), needs="offload_parameters"),
    Setting("loss_scale", ("fp16", "loss_scale")),
    Setting("initial_scale_power", ("fp16", "initial_scale_power")),
    Setting("loss_scale_window", ("fp16", "loss_scale_window")),
    Setting("hysteresis", ("fp16", "hysteresis")),
    Setting("min_loss_scale", ("fp16", "min_loss_scale")),
)

_DEFAULTS = {field.name: field.default for field in dataclasses.fields(DeepSpeedZeroConfig)}


def _written(setting: Setting, config: DeepSpeedZeroConfig) -> bool:
    if config.stage not in setting.stages:
        return False
    if setting.needs is not None and getattr(config, setting.needs) == "none":
        return False
    return not (setting.only_if_changed and getattr(config, setting.field) == _DEFAULTS[setting.field])


def table_values(config: DeepSpeedZeroConfig) -> dict[str, Any]:
    """The :data:`SETTINGS` of ``config`` as a nested DeepSpeed config (only those written at its stage and
    offloads)."""
    values: dict[str, Any] = {}
    for setting in SETTINGS:
        if _written(setting, config):
            *sections, key = setting.path
            node = values
            for section in sections:
                node = node.setdefault(section, {})
            node[key] = getattr(config, setting.field)
    return values


def _read(ds_config: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = ds_config
    for key in path:
        node = node.get(key) if isinstance(node, Mapping) else None
    return node


def zero_optimization_section(config: DeepSpeedZeroConfig) -> dict[str, Any]:
    """The ``zero_optimization`` block of a DeepSpeed config for ``config``."""
    section: dict[str, Any] = table_values(config)[_ZERO]
    if config.zenflow:
        section["zenflow"] = zenflow_section(config)
    return section


def to_deepspeed_config(config: DeepSpeedZeroConfig) -> dict[str, Any]:
    """Translate our dataclass into a DeepSpeed config dict; Trainer-owned values stay ``"auto"``.

    Gradient clipping is ``"auto"`` too, which resolves to the Trainer's ``gradient_clip_val`` or 0: DeepSpeed's
    own default (clip to norm 1.0) never applies silently.
    """
    return {
        "train_micro_batch_size_per_gpu": AUTO,
        "gradient_accumulation_steps": AUTO,
        "gradient_clipping": AUTO,
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "zero_optimization": zero_optimization_section(config),
        "fp16": {"enabled": AUTO, **table_values(config)["fp16"]},
        "bf16": {"enabled": AUTO, **_bf16_states(config.bf16_optimizer_states)},
    }


def _bf16_states(enabled: bool) -> dict[str, bool]:
    # DeepSpeed keeps optimizer states in bf16 only together with bf16 master weights and gradients.
    return {"bf16_master_weights_and_grads": True, "bf16_optimizer_states": True} if enabled else {}


def load_deepspeed_config(source: str | Path | Mapping[str, Any]) -> dict[str, Any]:
    """Read a DeepSpeed config from a dict or a JSON/YAML file, with one-line errors for bad input."""
    if isinstance(source, Mapping):
        return copy.deepcopy(dict(source))
    path = Path(source).expanduser()
    if not path.is_file():
        raise ZeroConfigError(
            f"DeepSpeed config file {str(path)!r} does not exist: pass an existing JSON or YAML file."
        )
    text = path.read_text()
    try:
        loaded = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as error:
        first_line = str(error).splitlines()[0]
        raise ZeroConfigError(
            f"DeepSpeed config file {str(path)!r} is not valid JSON/YAML ({first_line}): fix the file's syntax."
        ) from None
    if not isinstance(loaded, dict):
        raise ZeroConfigError(
            f"DeepSpeed config file {str(path)!r} must hold a mapping of settings, got {type(loaded).__name__}."
        )
    return loaded


def zero_stage(ds_config: Mapping[str, Any]) -> int:
    """The ZeRO stage a DeepSpeed config asks for (0 when it has no ``zero_optimization`` block)."""
    return int(ds_config.get("zero_optimization", {}).get("stage", 0))


def _given(value: Any) -> bool:
    """Whether a config value is set to a value of its own (not missing, ``None`` or ``"auto"``)."""
    return value is not None and value != AUTO


def zero_config_of(ds_config: Mapping[str, Any]) -> DeepSpeedZeroConfig:
    """What a full DeepSpeed config says in our terms: stage, offload devices, NVMe path, pinning and ratio, the
    communication settings and buckets it sets, fp16 loss scaling, and whether the CPU optimizer keeps bf16 states
    or runs ZenFlow (and overlaps its step).

    The strategy reads these (parameter placement, CPU Adam under offload) from the config it runs, so a
    config file and the strategy never disagree. Settings only lightning-zero has keep their defaults.
    """
    stage = zero_stage(ds_config)
    if stage not in (0, 1, 2, 3):
        raise ZeroConfigError(f"ZeRO stage must be 0, 1, 2 or 3, got {stage}: fix `zero_optimization.stage`.")
    given: dict[str, Any] = {}
    for setting in SETTINGS:  # the first place that gives a field wins (the optimizer's offload block)
        value = _read(ds_config, setting.path)
        if _given(value) and setting.field not in given:
            given[setting.field] = value
    offloaded = given.get("offload_optimizer", "none") != "none"
    bf16 = ds_config.get("bf16") or {}
    zenflow = _read(ds_config, (_ZERO, "zenflow")) or {}
    return DeepSpeedZeroConfig(
        **{**given, "stage": stage},
        # What the CPU optimizer the strategy builds must do: only under optimizer offload.
        bf16_optimizer_states=offloaded and bool(bf16.get("bf16_optimizer_states", False)),
        zenflow=offloaded and bool(zenflow),
        zenflow_overlap_step=offloaded and bool(zenflow.get("overlap_step", False)),
    )


@dataclasses.dataclass(frozen=True)
class TrainerValues:
    """What the Trainer decides, used to fill ``"auto"`` values before the model is built.

    Args:
        micro_batch_size: Batch size of one process's training dataloader.
        accumulate_grad_batches: The Trainer's gradient accumulation.
        gradient_clip_val: The Trainer's clipping norm, ``None`` when not set.
        precision: The Trainer's precision string, e.g. ``"32-true"`` or ``"bf16-mixed"``.
    """

    micro_batch_size: int
    accumulate_grad_batches: int = 1
    gradient_clip_val: float | None = None
    precision: str = "32-true"


def _fill(config: dict[str, Any], key: str, value: Any, where: str, trainer_name: str, explicit: bool) -> None:
    """Set ``config[key]`` to ``value`` when it is ``"auto"``; raise when an explicit value disagrees."""
    if key not in config or config[key] == AUTO:
        config[key] = value
    elif explicit and config[key] != value:
        raise ZeroConfigError(
            f"DeepSpeed config sets `{where}{key}: {config[key]}` but the Trainer has `{trainer_name}={value}`:"
            f" make them agree or set `{key}: auto` in the DeepSpeed config."
        )


def _resolve_precision(config: dict[str, Any], precision: str) -> None:
    """``fp16``/``bf16`` blocks follow the Trainer's precision: added when missing (DeepSpeed's default loss
    scaling), ``enabled: auto`` filled, disabled blocks dropped, a contradiction an error."""
    half = half_dtype(precision)
    wanted = {"fp16": half is torch.float16, "bf16": half is torch.bfloat16}
    for block, enabled in wanted.items():
        section = config.setdefault(block, {}) if enabled else config.get(block)
        if not isinstance(section, dict):
            continue
        value = section.get("enabled", AUTO)
        if value == AUTO:
            section["enabled"] = enabled
        elif bool(value) != enabled:
            raise ZeroConfigError(
                f"DeepSpeed config sets `{block}.enabled: {value}` but the Trainer has `precision={precision!r}`:"
                f" make them agree or set `{block}.enabled: auto` in the DeepSpeed config."
            )
    bf16 = config.get("bf16")
    if (
        isinstance(bf16, dict)
        and not bf16["enabled"]
        and (bf16.get("bf16_optimizer_states") or bf16.get("bf16_master_weights_and_grads"))
    ):
        raise ZeroConfigError(
            f"bf16 optimizer states and master weights need bf16 precision, but the Trainer has"
            f" `precision={precision!r}`: set `precision: bf16-mixed` or `bf16_optimizer_states: false`."
        )
    for block in list(wanted):
        if isinstance(config.get(block), dict) and not config[block]["enabled"]:
            del config[block]


_OPTIMIZER_HPARAMS = ("lr", "weight_decay", "betas", "eps")


def _resolve_optimizer(config: dict[str, Any], hparams: Mapping[str, Any]) -> None:
    params = config.get("optimizer", {}).get("params", {})
    for name, value in params.items():
        if value != AUTO:
            continue
        if name not in hparams:
            raise ZeroConfigError(
                f"DeepSpeed config has `optimizer.params.{name}: auto` but the module's optimizer has no {name!r}:"
                " give the value in the DeepSpeed config."
            )
        hparam = hparams[name]
        params[name] = list(hparam) if isinstance(hparam, tuple) else hparam


def _resolve_scheduler(config: dict[str, Any], learning_rate: float | None, total_steps: int) -> None:
    params = config.get("scheduler", {}).get("params", {})
    fills: dict[str, Any] = {
        "total_num_steps": total_steps,
        "warmup_max_lr": learning_rate,
        "warmup_min_lr": 0.0,
        "warmup_num_steps": 0,
    }
    for name, value in params.items():
        if value != AUTO:
            continue
        if fills.get(name) is None:
            raise ZeroConfigError(
                f"DeepSpeed config has `scheduler.params.{name}: auto` which cannot be inferred: give its value."
            )
        params[name] = fills[name]


#: Sections whose ``"auto"`` values come from the module's optimizer, once the model exists.
_MODULE_SECTIONS = ("optimizer", "scheduler")


def resolve_auto(ds_config: Mapping[str, Any], values: TrainerValues) -> dict[str, Any]:
    """Fill the Trainer's ``"auto"`` values, as Hugging Face Accelerate does; optimizer and scheduler ones stay
    for :func:`resolve_module_autos`.

    An explicit value that disagrees with what the Trainer decided is an error naming both. A missing
    ``gradient_clipping`` means the Trainer's value (0 when it does not clip), never DeepSpeed's default.
    """
    config = copy.deepcopy(dict(ds_config))
    _fill(config, "train_micro_batch_size_per_gpu", values.micro_batch_size, "", "batch_size", explicit=True)
    _fill(
        config,
        "gradient_accumulation_steps",
        values.accumulate_grad_batches,
        "",
        "accumulate_grad_batches",
        explicit=True,
    )
    clip = values.gradient_clip_val
    _fill(config, "gradient_clipping", float(clip or 0.0), "", "gradient_clip_val", explicit=clip is not None)
    if config.get("train_batch_size") == AUTO:
        del config["train_batch_size"]
    _resolve_precision(config, values.precision)
    _raise_on_leftover({key: value for key, value in config.items() if key not in _MODULE_SECTIONS})
    return config


def has_module_autos(ds_config: Mapping[str, Any]) -> bool:
    """Whether the optimizer or scheduler section has ``"auto"`` values (filled from the module's optimizer)."""
    return bool(_auto_paths({key: ds_config.get(key) for key in _MODULE_SECTIONS}))


def resolve_module_autos(ds_config: Mapping[str, Any], hparams: Mapping[str, Any], total_steps: int) -> dict[str, Any]:
    """Fill optimizer/scheduler ``"auto"`` values from the module's optimizer ``hparams`` (its ``defaults``:
    lr, weight_decay, betas, eps) and the run's optimizer steps."""
    config = copy.deepcopy(dict(ds_config))
    _resolve_optimizer(config, {key: hparams[key] for key in _OPTIMIZER_HPARAMS if key in hparams})
    _resolve_scheduler(config, hparams.get("lr"), total_steps)
    _raise_on_leftover(config)
    return config


#: Where ``"auto"`` is DeepSpeed's own value, resolved by DeepSpeed (ZenFlow's update and selection intervals).
_DEEPSPEED_AUTOS = ("zero_optimization.zenflow.",)


def _raise_on_leftover(config: Mapping[str, Any]) -> None:
    leftover = sorted(path for path in _auto_paths(config) if not path.startswith(_DEEPSPEED_AUTOS))
    if leftover:
        raise ZeroConfigError(f"DeepSpeed config has `auto` values that cannot be inferred: {leftover}; give them.")


def _auto_paths(node: Any, prefix: str = "") -> list[str]:
    if isinstance(node, dict):
        return [path for key, value in node.items() for path in _auto_paths(value, f"{prefix}{key}.")]
    return [prefix.rstrip(".")] if node == AUTO else []
