"""The DeepSpeed translation and "auto" resolution: pure functions, no DeepSpeed engine."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from lightning_zero.errors import ZeroConfigError
from lightning_zero.presets import PRESETS, Preset
from lightning_zero.strategies.deepspeed_config import (
    DeepSpeedZeroConfig,
    TrainerValues,
    has_module_autos,
    load_deepspeed_config,
    resolve_auto,
    resolve_module_autos,
    to_deepspeed_config,
    zero_config_of,
    zero_stage,
)

VALUES = TrainerValues(micro_batch_size=8, accumulate_grad_batches=2, gradient_clip_val=None, precision="32-true")


@pytest.mark.parametrize(
    "preset", [p for p in PRESETS if p.backend == "deepspeed" and "nvme" not in p.name], ids=lambda p: p.name
)
def test_presets_translate_to_their_stage_and_offload(preset: Preset) -> None:
    config = resolve_auto(to_deepspeed_config(DeepSpeedZeroConfig(**preset.fields)), VALUES)
    zero = config["zero_optimization"]
    assert zero["stage"] == preset.fields["stage"]
    assert ("offload_optimizer" in zero) == (preset.fields.get("offload_optimizer", "none") != "none")
    assert ("offload_param" in zero) == (preset.fields.get("offload_parameters", "none") != "none")
    assert ("stage3_prefetch_bucket_size" in zero) == (zero["stage"] == 3)


@pytest.mark.parametrize(
    "preset", [p for p in PRESETS if p.name in ("zero2_offload", "zero3_offload")], ids=lambda p: p.name
)
def test_offload_presets_pin_host_buffers_unless_told(preset: Preset) -> None:
    def pinned(**fields: bool) -> list[bool]:
        zero = to_deepspeed_config(DeepSpeedZeroConfig(**{**preset.fields, **fields}))["zero_optimization"]
        return [zero[key]["pin_memory"] for key in ("offload_optimizer", "offload_param") if key in zero]

    assert pinned() and all(pinned())
    assert not any(pinned(pin_memory=False))


def test_no_clipping_asked_means_none_happens() -> None:
    # DeepSpeed clips to norm 1.0 when the key is missing; ours must always write the Trainer's choice.
    config = resolve_auto(to_deepspeed_config(DeepSpeedZeroConfig()), VALUES)
    assert config["gradient_clipping"] == 0.0
    from_file = resolve_auto({"zero_optimization": {"stage": 2}}, VALUES)
    assert from_file["gradient_clipping"] == 0.0


def test_trainer_values_fill_auto() -> None:
    values = TrainerValues(
        micro_batch_size=16, accumulate_grad_batches=4, gradient_clip_val=0.5, precision="bf16-mixed"
    )
    config = resolve_auto(to_deepspeed_config(DeepSpeedZeroConfig()), values)
    assert config["train_micro_batch_size_per_gpu"] == 16
    assert config["gradient_accumulation_steps"] == 4
    assert config["gradient_clipping"] == 0.5
    assert config["bf16"] == {"enabled": True}
    assert "fp16" not in config


def test_fp16_block_keeps_loss_scale_settings() -> None:
    config = resolve_auto(
        to_deepspeed_config(DeepSpeedZeroConfig(initial_scale_power=12)),
        TrainerValues(micro_batch_size=1, precision="16-mixed"),
    )
    assert config["fp16"]["enabled"] is True
    assert config["fp16"]["initial_scale_power"] == 12
    assert "bf16" not in config


@pytest.mark.parametrize(
    ("key", "value", "trainer_name"),
    [
        ("train_micro_batch_size_per_gpu", 4, "batch_size=8"),
        ("gradient_accumulation_steps", 1, "accumulate_grad_batches=2"),
    ],
)
def test_explicit_value_conflicting_with_trainer_is_one_line_error(key: str, value: int, trainer_name: str) -> None:
    with pytest.raises(ZeroConfigError) as error:
        resolve_auto({key: value}, VALUES)
    message = str(error.value)
    assert "\n" not in message
    assert f"{key}: {value}" in message and trainer_name in message


def test_explicit_clipping_conflict_only_when_trainer_clips() -> None:
    assert resolve_auto({"gradient_clipping": 1.0}, VALUES)["gradient_clipping"] == 1.0
    clipping = TrainerValues(micro_batch_size=8, accumulate_grad_batches=2, gradient_clip_val=0.5)
    with pytest.raises(ZeroConfigError, match=r"gradient_clip_val=0\.5"):
        resolve_auto({"gradient_clipping": 1.0}, clipping)


def test_precision_conflict_names_both() -> None:
    with pytest.raises(ZeroConfigError, match=r"fp16.enabled: True.*precision='32-true'"):
        resolve_auto({"fp16": {"enabled": True}}, VALUES)


def test_optimizer_and_scheduler_auto_from_module_and_trainer() -> None:
    module_sections = {
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto", "betas": "auto"}},
        "scheduler": {
            "type": "WarmupDecayLR",
            "params": {"total_num_steps": "auto", "warmup_max_lr": "auto", "warmup_num_steps": 10},
        },
    }
    # Before the model exists only the Trainer's values are filled; the module's wait for its optimizer.
    early = resolve_auto(module_sections, VALUES)
    assert has_module_autos(early) and early["optimizer"] == module_sections["optimizer"]
    hparams = {"lr": 3e-4, "weight_decay": 0.1, "betas": (0.9, 0.95), "eps": 1e-8, "amsgrad": False}
    config = resolve_module_autos(early, hparams, total_steps=1000)
    assert not has_module_autos(config)
    assert config["optimizer"]["params"] == {"lr": 3e-4, "weight_decay": 0.1, "betas": [0.9, 0.95]}
    assert config["scheduler"]["params"] == {"total_num_steps": 1000, "warmup_max_lr": 3e-4, "warmup_num_steps": 10}


def test_auto_that_cannot_be_inferred_is_an_error() -> None:
    with pytest.raises(ZeroConfigError, match=r"optimizer.params.momentum: auto"):
        resolve_module_autos({"optimizer": {"type": "SGD", "params": {"momentum": "auto"}}}, {"lr": 0.1}, 10)
    with pytest.raises(ZeroConfigError, match=r"zero_optimization.reduce_bucket_size"):
        resolve_auto({"zero_optimization": {"reduce_bucket_size": "auto"}}, VALUES)


def test_fp16_block_is_added_once_with_deepspeeds_loss_scaling_when_a_file_has_none() -> None:
    config = resolve_auto({"zero_optimization": {"stage": 2}}, TrainerValues(micro_batch_size=1, precision="16-mixed"))
    assert config["fp16"] == {"enabled": True}  # DeepSpeed's own loss-scale defaults apply
    assert "bf16" not in resolve_auto({}, VALUES) and "fp16" not in resolve_auto({}, VALUES)


def test_a_deepspeed_config_file_is_what_the_strategy_reads() -> None:
    ds_config = {
        "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"}},
        "fp16": {"enabled": "auto", "initial_scale_power": 8, "loss_scale_window": 100},
    }
    zero = zero_config_of(ds_config)
    assert (zero.stage, zero.offload_optimizer, zero.offload_parameters) == (3, "cpu", "cpu")
    assert (zero.initial_scale_power, zero.loss_scale_window) == (8, 100)
    assert zero_config_of({}).stage == 0 and not zero_config_of({}).offloads
    with pytest.raises(ZeroConfigError, match=r"got 4: fix `zero_optimization.stage`"):
        zero_config_of({"zero_optimization": {"stage": 4}})


def test_the_strategy_takes_placement_and_loss_scaling_from_a_config_file() -> None:
    from lightning_zero.strategies.deepspeed import ZeroStrategy

    ds_config = {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}, "fp16": {"hysteresis": 4}}
    strategy = ZeroStrategy(deepspeed_config=ds_config)
    assert strategy.zero.stage == 3 and strategy.remote_device == "cpu"
    assert strategy.config is not None
    assert strategy.config["fp16"] == {"hysteresis": 4}  # loss scaling travels in the config, once
    preset = ZeroStrategy(zero={"stage": 3, "offload_parameters": "cpu", "offload_optimizer": "cpu"})  # type: ignore[arg-type]
    assert preset.config is not None
    assert preset.remote_device == "cpu" and preset.config["fp16"]["loss_scale_window"] == 1000


def test_resolve_does_not_mutate_its_input() -> None:
    original = to_deepspeed_config(DeepSpeedZeroConfig())
    snapshot = json.dumps(original, sort_keys=True)
    resolve_auto(original, VALUES)
    assert json.dumps(original, sort_keys=True) == snapshot


def test_load_json_and_yaml(tmp_path: Path) -> None:
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 3}}')
    (tmp_path / "ds.yaml").write_text("zero_optimization:\n  stage: 1\n")
    assert zero_stage(load_deepspeed_config(tmp_path / "ds.json")) == 3
    assert zero_stage(load_deepspeed_config(str(tmp_path / "ds.yaml"))) == 1
    assert load_deepspeed_config({"a": {"b": 1}}) == {"a": {"b": 1}}


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("missing.json", None, "does not exist"),
        ("broken.json", '{"zero_optimization": ', "not valid JSON/YAML"),
        ("broken.yaml", "a: [1, 2\n", "not valid JSON/YAML"),
        ("list.yaml", "- 1\n- 2\n", "must hold a mapping"),
    ],
)
def test_bad_config_files_are_one_line_errors(tmp_path: Path, name: str, text: str | None, expected: str) -> None:
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    with pytest.raises(ZeroConfigError) as error:
        load_deepspeed_config(path)
    assert expected in str(error.value)
    assert "\n" not in str(error.value)


def test_compiling_blocks_is_refused_under_stage_3() -> None:
    assert DeepSpeedZeroConfig(stage=2, compile_blocks=True).compile_blocks
    with pytest.raises(ZeroConfigError, match="set `compile_blocks: false` or a stage of 0-2"):
        DeepSpeedZeroConfig(stage=3, compile_blocks=True)


def test_optimizer_offload_is_read_back_from_a_config() -> None:
    offloaded = to_deepspeed_config(DeepSpeedZeroConfig(stage=2, offload_optimizer="cpu"))
    assert zero_config_of(offloaded).offload_optimizer == "cpu"
    assert zero_config_of(to_deepspeed_config(DeepSpeedZeroConfig(stage=3))).offload_optimizer == "none"
    assert zero_config_of({"zero_optimization": {"offload_optimizer": {"device": "none"}}}).offload_optimizer == "none"


# --- offload levers (DeepSpeed 0.19.8 keys, checked against DeepSpeed's own config models) -------------------


def _validated_by_deepspeed(config: dict[str, object]) -> None:
    """DeepSpeed's pydantic models forbid unknown keys: a misspelt key or a bad value fails here."""
    from deepspeed.runtime.precision_config import DeepSpeedBF16Config
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig as DeepSpeedsZeroConfig

    DeepSpeedsZeroConfig(**config["zero_optimization"])  # type: ignore[arg-type]
    DeepSpeedBF16Config(**config.get("bf16", {}))  # type: ignore[arg-type]


def test_bf16_optimizer_states_set_both_deepspeed_switches_and_need_bf16() -> None:
    zero = DeepSpeedZeroConfig(stage=2, offload_optimizer="cpu", bf16_optimizer_states=True)
    config = resolve_auto(to_deepspeed_config(zero), TrainerValues(micro_batch_size=2, precision="bf16-mixed"))
    assert config["bf16"] == {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}
    _validated_by_deepspeed(config)
    assert "bf16_optimizer_states" not in to_deepspeed_config(DeepSpeedZeroConfig())["bf16"]  # off by default
    with pytest.raises(ZeroConfigError, match=r"need bf16 precision.*precision='16-mixed'"):
        resolve_auto(to_deepspeed_config(zero), TrainerValues(micro_batch_size=2, precision="16-mixed"))
    assert zero_config_of(config).bf16_optimizer_states  # the strategy's CPU Adam keeps bf16 moments


def test_zenflow_block_has_deepspeeds_keys() -> None:
    zero = DeepSpeedZeroConfig(stage=2, offload_optimizer="cpu", zenflow=True, zenflow_topk_ratio=0.05)
    config = to_deepspeed_config(zero)
    assert config["zero_optimization"]["zenflow"] == {
        "topk_ratio": 0.05,
        "update_interval": "auto",
        "select_strategy": "auto",
        "select_interval": "auto",
        "overlap_step": False,
        "full_warm_up_rounds": 0,
    }
    _validated_by_deepspeed(config)
    fixed = to_deepspeed_config(
        zero.replace(zenflow_update_interval=4, zenflow_select_interval=100, zenflow_overlap_step=True)
    )
    section = fixed["zero_optimization"]["zenflow"]
    assert (section["update_interval"], section["select_strategy"], section["select_interval"]) == (4, "step", 100)
    _validated_by_deepspeed(fixed)
    assert "zenflow" not in to_deepspeed_config(DeepSpeedZeroConfig(offload_optimizer="cpu"))["zero_optimization"]
    read = zero_config_of(fixed)
    assert read.zenflow and read.zenflow_overlap_step
    assert not zero_config_of({"zero_optimization": {"stage": 2, "zenflow": {"topk_ratio": 0.1}}}).zenflow


def test_offload_ratio_is_deepspeeds_stage_3_ratio() -> None:
    zero = DeepSpeedZeroConfig(stage=3, offload_optimizer="cpu", offload_ratio=0.3)
    config = to_deepspeed_config(zero)
    assert config["zero_optimization"]["offload_optimizer"]["ratio"] == 0.3
    _validated_by_deepspeed(config)
    whole = to_deepspeed_config(zero.replace(offload_ratio=1.0))["zero_optimization"]["offload_optimizer"]
    assert "ratio" not in whole  # DeepSpeed's default, 1.0


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"stage": 2, "offload_optimizer": "cpu", "offload_ratio": 0.5}, "needs stage 3 with optimizer offload"),
        ({"stage": 3, "offload_optimizer": "cpu", "offload_ratio": 0.0}, "in \\(0, 1\\]"),
        ({"stage": 2, "bf16_optimizer_states": True}, "`bf16_optimizer_states` needs the optimizer offloaded"),
        (
            {"stage": 2, "offload_optimizer": "cpu", "cpu_adam_for_offload": False, "zenflow": True},
            "`zenflow` needs the optimizer offloaded and stepped by DeepSpeed's CPU Adam",
        ),
        ({"zenflow_topk_ratio": 1.0}, "between 0 and 1"),
        ({"zenflow_update_interval": 0}, "at least 1 step"),
        ({"zenflow_full_warm_up_rounds": -1}, "0 or more"),
    ],
)
def test_bad_offload_levers_are_one_line_errors(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ZeroConfigError, match=message):
        DeepSpeedZeroConfig.from_dict(fields)


#: Fields DeepSpeed's config does not hold as they are: ours alone, or derived into a block of their own.
_NOT_IN_THE_TABLE = {
    "activation_checkpointing",
    "compile_blocks",
    "memory_budget_gib",
    "cpu_adam_for_offload",
    "bf16_optimizer_states",
    "zenflow",
    "zenflow_topk_ratio",
    "zenflow_update_interval",
    "zenflow_select_interval",
    "zenflow_overlap_step",
    "zenflow_full_warm_up_rounds",
}


def test_every_field_has_one_route_into_deepspeeds_config() -> None:
    """A new field fails here until it is in the one table (or said to be ours): nothing translated by hand."""
    from lightning_zero.strategies.deepspeed_config import SETTINGS

    fields = {field.name for field in dataclasses.fields(DeepSpeedZeroConfig)}
    assert {setting.field for setting in SETTINGS} == fields - _NOT_IN_THE_TABLE
    assert len({setting.path for setting in SETTINGS}) == len(SETTINGS)


@pytest.mark.parametrize(
    "fields",
    [
        {"stage": 1, "allgather_bucket_size": 123, "overlap_comm": False, "loss_scale": 128.0},
        {"stage": 2, "offload_optimizer": "cpu", "pin_memory": False, "sub_group_size": 7, "hysteresis": 4},
        {"stage": 3, "prefetch_bucket_size": 11, "param_persistence_threshold": 12, "max_live_parameters": 13},
        {"stage": 3, "offload_optimizer": "cpu", "offload_parameters": "cpu", "offload_ratio": 0.5},
        {"stage": 3, "offload_parameters": "cpu", "offload_buffer_count": 3, "offload_buffer_size": 9},
    ],
)
def test_the_translation_and_its_inverse_are_one_table(fields: dict[str, Any]) -> None:
    config = DeepSpeedZeroConfig(**fields)
    assert zero_config_of(to_deepspeed_config(config)) == config
