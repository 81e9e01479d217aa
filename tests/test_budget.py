"""The memory budget: validated in the config, a one-line error naming the smallest layout that fits, host RAM."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from lightning_zero.errors import ZeroConfigError
from lightning_zero.memory.budget import (
    GIB,
    apply_memory_budget,
    cap_device_memory,
    check_host_memory,
    check_model_states_fit,
)
from lightning_zero.memory.states import Layout, ParameterShapes
from lightning_zero.strategies.config import ZeroConfig
from lightning_zero.strategies.deepspeed_config import DeepSpeedZeroConfig
from tests.helpers.runif import RunIf

#: 2**28 parameters: 4 GiB under DDP in fp32 (16 bytes each), 1 GiB of them per device for a ZeRO-3 shard of 4.
SHAPES = ParameterShapes(shapes=((2**14, 2**14),), largest_layer=2**28)


@pytest.mark.parametrize("bad", [0, -1.0, "24", True])
def test_budget_must_be_a_positive_number(bad: object) -> None:
    with pytest.raises(ZeroConfigError, match="memory_budget_gib"):
        ZeroConfig(memory_budget_gib=bad)  # type: ignore[arg-type]


def test_budget_is_a_shared_field() -> None:
    assert DeepSpeedZeroConfig.from_dict({"memory_budget_gib": 24}).memory_budget_gib == 24


def test_model_states_over_budget_name_the_smallest_layout_that_fits() -> None:
    with pytest.raises(ZeroConfigError, match=r"zero1 needs 2\.50 GiB .* use strategy `zero3`") as error:
        check_model_states_fit(SHAPES, Layout("deepspeed", 1), 1.5, devices=4, nodes=1, precision="32-true")
    assert "\n" not in str(error.value)
    # 16-bit mixed: DeepSpeed's estimators put ZeRO-2 at 1.62 GiB, ZeRO-3 at 2.12 GiB, ZeRO-2 offload at 0.5 GiB.
    with pytest.raises(ZeroConfigError, match="use strategy `zero2_offload`"):
        check_model_states_fit(SHAPES, Layout("deepspeed", 2), 0.9, devices=4, nodes=1, precision="16-mixed")
    with pytest.raises(ZeroConfigError, match="use strategy `zero3_fsdp`"):
        check_model_states_fit(SHAPES, Layout("fsdp2", 2), 1.1, devices=4, nodes=1, precision="32-true")


def test_nothing_fits_says_so() -> None:
    with pytest.raises(ZeroConfigError, match="no layout fits on 1 device"):
        check_model_states_fit(SHAPES, Layout("fsdp2", 3), 0.001, devices=1, nodes=1, precision="32-true")


def test_fitting_states_pass() -> None:
    states = check_model_states_fit(SHAPES, Layout("deepspeed", 3), 1.5, devices=4, nodes=1, precision="32-true")
    assert states.device_bytes == GIB


def test_host_memory_check() -> None:
    check_host_memory(10, "Offload", available_bytes=11)
    with pytest.raises(ZeroConfigError, match=r"Offload needs 2\.00 GiB of host RAM but 1\.00 GiB is free"):
        check_host_memory(2 * GIB, "Offload", available_bytes=GIB)


def strategy(zero: DeepSpeedZeroConfig, model: nn.Module) -> SimpleNamespace:
    return SimpleNamespace(
        zero=zero,
        model=model,
        num_processes=2,
        num_nodes=1,
        precision_plugin=SimpleNamespace(precision="32-true"),
        root_device=torch.device("cpu"),
    )


def test_strategies_apply_the_budget_in_setup() -> None:
    model = nn.Linear(1024, 1024)  # ~1 M parameters: 16 MiB under DDP-like stage 1 states
    apply_memory_budget(strategy(DeepSpeedZeroConfig(stage=1), model), "deepspeed")  # no budget: nothing checked
    apply_memory_budget(strategy(DeepSpeedZeroConfig(stage=3, memory_budget_gib=0.009), model), "deepspeed")
    with pytest.raises(ZeroConfigError, match="use strategy `zero3`"):
        apply_memory_budget(strategy(DeepSpeedZeroConfig(stage=1, memory_budget_gib=0.009), model), "deepspeed")


@RunIf(min_cuda_gpus=1)
def test_cuda_allocations_over_the_budget_fail() -> None:
    device = torch.device("cuda", 0)
    cap_device_memory(device, 1.0)
    try:
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(int(1.5 * GIB), dtype=torch.uint8, device=device)
        torch.empty(int(0.5 * GIB), dtype=torch.uint8, device=device)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)


def test_every_preset_has_the_layout_its_name_says() -> None:
    from lightning_zero.memory.budget import preset_layout
    from lightning_zero.preset_table import PRESETS

    for preset in PRESETS:
        if preset.backend != "auto":  # NVMe offload is planned as CPU offload's layout
            assert preset_layout(preset).name == preset.name.replace("_nvme", ""), preset.name


def test_escalation_goes_from_least_to_most_memory_saving() -> None:
    from lightning_zero.memory.budget import escalation

    assert [name for name, _ in escalation("deepspeed")] == [
        "zero1",
        "zero2",
        "zero3",
        "zero2_offload",
        "zero3_offload",
    ]
    assert [name for name, _ in escalation("fairscale")] == ["zero1_fairscale", "zero2_fairscale", "zero3_offload"]
    assert [name for name, _ in escalation("fsdp2")] == ["zero2_fsdp", "zero3_fsdp", "zero3_offload_fsdp"]


def test_teardown_lifts_the_process_wide_gpu_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from lightning_zero.memory.budget import lift_memory_budget

    fractions: list[tuple[float, torch.device]] = []
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d: fractions.append((f, d)))
    gpu = torch.device("cuda", 0)
    lift_memory_budget(SimpleNamespace(root_device=gpu, zero=SimpleNamespace(memory_budget_gib=None)))
    lift_memory_budget(SimpleNamespace(root_device=torch.device("cpu"), zero=SimpleNamespace(memory_budget_gib=24)))
    assert fractions == []  # nothing was capped
    lift_memory_budget(SimpleNamespace(root_device=gpu, zero=SimpleNamespace(memory_budget_gib=24)))
    assert fractions == [(1.0, gpu)]


def test_every_presets_layout_round_trips_through_its_config_fields() -> None:
    """One layout type: a preset's fields, its typed config, the plan's layout and zero_auto's config fields all say
    the same layout, a partial stage-3 offload's ratio included (the budget check once took it for a full one)."""
    from dataclasses import replace

    from lightning_zero.memory.budget import layout_of, preset_layout
    from lightning_zero.memory.states import Layout
    from lightning_zero.preset_table import PRESETS
    from lightning_zero.presets import build_preset

    for preset in PRESETS:
        if preset.backend in ("auto", "onecard"):  # one card: no ZeRO layout
            continue
        layout = preset_layout(preset)
        for variant in (layout, replace(layout, activation_checkpointing=True)):
            device = "nvme" if "nvme" in preset.name else "cpu"
            assert Layout.of(preset.backend, variant.config_fields(device)) == variant, preset.name
        fields = {"nvme_path": "/tmp"} if "nvme" in preset.name else {}
        assert layout_of(preset.backend, build_preset(preset.name, **fields).zero) == layout, preset.name
    partial = build_preset("zero3_offload", offload_ratio=0.5).zero
    assert layout_of("deepspeed", partial).offload_ratio == 0.5
    assert Layout.of("deepspeed", layout_of("deepspeed", partial).config_fields()).offload_ratio == 0.5


def test_a_deepspeed_config_files_typed_view_keeps_what_deepspeed_runs() -> None:
    from lightning_zero.strategies.deepspeed_config import DeepSpeedZeroConfig, to_deepspeed_config, zero_config_of

    given = DeepSpeedZeroConfig(
        stage=3,
        offload_optimizer="cpu",
        offload_ratio=0.3,
        pin_memory=False,
        overlap_comm=False,
        reduce_bucket_size=123,
        prefetch_bucket_size=456,
    )
    assert zero_config_of(to_deepspeed_config(given)) == given
    written = DeepSpeedZeroConfig(
        stage=2, offload_optimizer="cpu", allgather_bucket_size=789, contiguous_gradients=False
    )
    assert zero_config_of(to_deepspeed_config(written)) == written


def test_expandable_segments_are_switched_on_for_cuda_only_and_given_back_as_the_user_had_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from lightning_zero.memory import allocator

    settings: list[str] = []
    users = ["max_split_size_mb:128"]
    monkeypatch.setattr(allocator, "cuda_allocator_settings", lambda: users[0])
    monkeypatch.setattr(allocator, "set_cuda_allocator_settings", settings.append)
    assert allocator.use_expandable_segments(torch.device("cpu"), "test") is None and settings == []
    previous = allocator.use_expandable_segments(torch.device("cuda", 0), "test")
    assert settings == ["expandable_segments:True"] and previous == "max_split_size_mb:128"
    allocator.restore_allocator(previous)
    assert settings[-1] == "max_split_size_mb:128,expandable_segments:False"
    allocator.restore_allocator("")
    assert settings[-1] == "expandable_segments:False"
    users[0] = "expandable_segments:True,max_split_size_mb:64"  # the user's own: left as it is, nothing to give back
    assert allocator.use_expandable_segments(torch.device("cuda", 0), "test") is None and len(settings) == 3
    allocator.restore_allocator(users[0])
    assert settings[-1] == users[0]
    from lightning_zero.auto.strategy import AutoZeroConfig
    from lightning_zero.strategies.onecard_config import OneCardConfig

    assert AutoZeroConfig().expandable_segments and OneCardConfig().expandable_segments
