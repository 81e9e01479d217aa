"""DeepSpeed configs checked against DeepSpeed's own parser: unknown sections and keys are one line, valid configs
(every one this repository uses, and Hugging Face-style ones full of "auto") pass."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lightning_zero.errors import ZeroConfigError
from lightning_zero.presets import PRESETS
from lightning_zero.strategies.deepspeed import ZeroStrategy
from lightning_zero.strategies.deepspeed_config import (
    DeepSpeedZeroConfig,
    TrainerValues,
    load_deepspeed_config,
    resolve_auto,
    to_deepspeed_config,
)
from lightning_zero.strategies.deepspeed_schema import CONFIG_REFERENCE, check_deepspeed_config
from tests.helpers.launch import REPO

# The shapes Hugging Face Accelerate / Transformers users bring: everything the Trainer decides left "auto".
HF_ZERO2_OFFLOAD: dict[str, Any] = {
    "fp16": {
        "enabled": "auto",
        "loss_scale": 0,
        "loss_scale_window": 1000,
        "initial_scale_power": 16,
        "hysteresis": 2,
        "min_loss_scale": 1,
    },
    "bf16": {"enabled": "auto"},
    "optimizer": {
        "type": "AdamW",
        "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
    },
    "scheduler": {
        "type": "WarmupLR",
        "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto"},
    },
    "zero_optimization": {
        "stage": 2,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "allgather_partitions": True,
        "allgather_bucket_size": 2e8,
        "overlap_comm": True,
        "reduce_scatter": True,
        "reduce_bucket_size": "auto",
        "contiguous_gradients": True,
        "round_robin_gradients": True,
    },
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "steps_per_print": 2000,
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "wall_clock_breakdown": False,
}
HF_ZERO3_OFFLOAD: dict[str, Any] = {
    **HF_ZERO2_OFFLOAD,
    "scheduler": {
        "type": "WarmupDecayLR",
        "params": {
            "total_num_steps": "auto",
            "warmup_min_lr": "auto",
            "warmup_max_lr": "auto",
            "warmup_num_steps": "auto",
        },
    },
    "zero_optimization": {
        "stage": 3,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "offload_param": {"device": "cpu", "pin_memory": True},
        "overlap_comm": True,
        "contiguous_gradients": True,
        "sub_group_size": 1e9,
        "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto",
        "stage3_max_live_parameters": 1e9,
        "stage3_max_reuse_distance": 1e9,
        "stage3_gather_16bit_weights_on_model_save": True,
    },
}
OTHER_VALID: dict[str, dict[str, Any]] = {
    "bf16-under-its-old-name": {"bfloat16": {"enabled": True}, "zero_optimization": {"stage": 1}},
    "monitors-and-profiler": {
        "tensorboard": {"enabled": False, "output_path": "logs/"},
        "csv_monitor": {"enabled": False},
        "flops_profiler": {"enabled": False, "profile_step": 1},
        "comms_logger": {"enabled": False},
    },
    "activation-checkpointing-and-aio": {
        "activation_checkpointing": {"partition_activations": False, "cpu_checkpointing": False},
        "aio": {"block_size": 1048576, "queue_depth": 8},
    },
    "mesh-sizes-read-by-initialize": {"sequence_parallel_size": 1, "data_parallel_size": 2},
    "explicit-batch": {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4},
}


def message(config: dict[str, Any], source: str | Path | None = None) -> str:
    with pytest.raises(ZeroConfigError) as caught:
        check_deepspeed_config(config, source)
    text = str(caught.value)
    assert "\n" not in text
    return text


@pytest.mark.parametrize("path", sorted((REPO / "tests" / "data").glob("ds_*")), ids=lambda path: path.name)
def test_the_repository_config_files_pass(path: Path) -> None:
    check_deepspeed_config(load_deepspeed_config(path), path)


@pytest.mark.parametrize("preset", [p for p in PRESETS if p.backend == "deepspeed"], ids=lambda p: p.name)
def test_every_preset_config_passes_before_and_after_auto(preset: Any, tmp_path: Path) -> None:
    fields = {**preset.fields, "nvme_path": str(tmp_path)} if "nvme" in preset.name else preset.fields
    config = to_deepspeed_config(DeepSpeedZeroConfig(**fields))
    check_deepspeed_config(config)
    check_deepspeed_config(resolve_auto(config, TrainerValues(micro_batch_size=4, precision="bf16-mixed")))


@pytest.mark.parametrize(
    "config",
    [HF_ZERO2_OFFLOAD, HF_ZERO3_OFFLOAD, *OTHER_VALID.values()],
    ids=["hf-zero2-offload", "hf-zero3-offload", *OTHER_VALID],
)
def test_valid_configs_pass(config: dict[str, Any]) -> None:
    check_deepspeed_config(config)


def test_a_misspelled_section_names_the_right_one() -> None:
    # DeepSpeed itself ignores it: the run would train without ZeRO.
    text = message({"zero_optimisation": {"stage": 3}}, "ds.json")
    assert text == (
        "DeepSpeed config file 'ds.json': unknown section `zero_optimisation`, which DeepSpeed would silently ignore:"
        " did you mean `zero_optimization`?"
    )


def test_a_misspelled_top_level_value_names_the_right_one() -> None:
    assert "did you mean `gradient_clipping`?" in message({**HF_ZERO2_OFFLOAD, "gradient_cliping": 1.0})


def test_a_section_nothing_like_any_points_to_the_reference() -> None:
    text = message({"my_plugin": {}})
    assert "`my_plugin`, which DeepSpeed would silently ignore: remove it" in text
    assert text.endswith(f"check its spelling against {CONFIG_REFERENCE}.")


@pytest.mark.parametrize(
    ("section", "value", "expected"),
    [
        (
            "zero_optimization",
            {"stage": 3, "stage3_prefetch_bucket_sizee": 1},
            "unknown key `zero_optimization.stage3_prefetch_bucket_sizee`: did you mean `stage3_prefetch_bucket_size`?",
        ),
        (
            "zero_optimization",
            {"stage": 3, "offload_param": {"device": "cpu", "pin_memmory": True}},
            "unknown key `zero_optimization.offload_param.pin_memmory`: did you mean `pin_memory`?",
        ),
        (
            "fp16",
            {"enabled": "auto", "initial_scale_pwer": 12},
            "`fp16.initial_scale_pwer`: did you mean `initial_scale_power`?",
        ),
        ("tensorboard", {"enabeld": True}, "unknown key `tensorboard.enabeld`: did you mean `enabled`?"),
        ("zero_optimization", {"stage": "three"}, "bad value 'three' for `zero_optimization.stage`: Input should be"),
        ("zero_optimization", {"stage": 2, "reduce_bucket_size": -1}, "`zero_optimization.reduce_bucket_size`"),
        ("zero_optimization", "yes", "DeepSpeed refuses section `zero_optimization`: "),
        (
            "zero_optimization",
            {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}},
            "DeepSpeed refuses section `zero_optimization`: Assertion failed, Partial offloading only supported for"
            " ZeRO Stage 3.",
        ),
        ("amp", {"enabled": True}, "DeepSpeed refuses section `amp`: NVIDIA Apex AMP integration has been removed."),
    ],
    ids=[
        "zero-key",
        "offload-key",
        "fp16-key",
        "monitor-key",
        "stage-word",
        "negative-bucket",
        "not-a-mapping",
        "across-keys",
        "removed",
    ],
)
def test_a_bad_key_or_value_in_a_section_is_one_line(section: str, value: Any, expected: str) -> None:
    assert expected in message({"train_micro_batch_size_per_gpu": "auto", section: value})


def test_the_strategy_checks_a_config_file_when_built(tmp_path: Path) -> None:
    path = tmp_path / "ds.yaml"
    path.write_text("zero_optimisation:\n  stage: 3\n")
    with pytest.raises(ZeroConfigError, match=r"ds.yaml': unknown section `zero_optimisation`.*`zero_optimization`"):
        ZeroStrategy(deepspeed_config=path)
    with pytest.raises(ZeroConfigError, match=r"^DeepSpeed config: unknown key `zero_optimization.stagee`"):
        ZeroStrategy(deepspeed_config={"zero_optimization": {"stagee": 3}})
