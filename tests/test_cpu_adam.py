"""The optimizer-offload swap keeps the user's hyper-parameters, groups and scheduler."""

from __future__ import annotations

import warnings
from typing import Any, cast

import pytest
import torch

from lightning_zero.strategies import cpu_adam
from lightning_zero.strategies.deepspeed_config import DeepSpeedZeroConfig


def make_model() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))


@pytest.mark.parametrize(("optimizer_class", "adamw_mode"), [(torch.optim.AdamW, True), (torch.optim.Adam, False)])
def test_swap_keeps_hyper_parameters_and_groups(
    optimizer_class: type[torch.optim.Adam] | type[torch.optim.AdamW], adamw_mode: bool
) -> None:
    model = make_model()
    decay, no_decay = list(model[0].parameters()) + list(model[2].parameters()), list(model[1].parameters())
    groups: list[dict[str, Any]] = [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
    original = optimizer_class(
        groups,
        lr=3e-4,
        betas=(0.8, 0.9),
        eps=1e-6,
        weight_decay=0.05,
    )
    swapped = cpu_adam.to_cpu_adam(original)
    assert type(swapped).__name__ == "DeepSpeedCPUAdam"
    assert cast(Any, swapped).adam_w_mode == adamw_mode
    assert [g["weight_decay"] for g in swapped.param_groups] == [0.05, 0.0]
    assert all(g["lr"] == 3e-4 and tuple(g["betas"]) == (0.8, 0.9) and g["eps"] == 1e-6 for g in swapped.param_groups)
    assert [len(g["params"]) for g in swapped.param_groups] == [4, 2]


def test_swapped_optimizer_steps_like_torch_adamw() -> None:
    reference, candidate = make_model(), make_model()
    torch_adamw = torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.1)
    ds_adamw = cpu_adam.to_cpu_adam(torch.optim.AdamW(candidate.parameters(), lr=1e-2, weight_decay=0.1))
    inputs = torch.randn(16, 8)
    for _ in range(5):
        for model, optimizer in ((reference, torch_adamw), (candidate, ds_adamw)):
            optimizer.zero_grad()
            model(inputs).square().mean().backward()
            optimizer.step()
    for a, b in zip(reference.parameters(), candidate.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_only_plain_adam_without_amsgrad_is_swapped() -> None:
    params = make_model().parameters()
    assert cpu_adam.is_swappable(torch.optim.AdamW(params))
    assert not cpu_adam.is_swappable(torch.optim.AdamW(make_model().parameters(), amsgrad=True))
    assert not cpu_adam.is_swappable(torch.optim.SGD(make_model().parameters(), lr=0.1))


def test_rebound_scheduler_drives_the_new_optimizer_without_warnings() -> None:
    model = make_model()
    original = torch.optim.AdamW(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LinearLR(original, start_factor=1.0, end_factor=0.5, total_iters=2)
    swapped = cpu_adam.to_cpu_adam(original)
    cpu_adam.rebind_scheduler(scheduler, swapped)
    model(torch.randn(2, 8)).sum().backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        swapped.step()
        scheduler.step()
    assert swapped.param_groups[0]["lr"] == pytest.approx(0.75)


def test_swap_keeps_bf16_moments_or_builds_zenflows_cpu_adam() -> None:
    # What DeepSpeed 0.19.8 asserts: bf16_optimizer_states under offload needs fp32_optimizer_states=False, and
    # its ZenFlow optimizer steps a ZenFlowCPUAdam.
    bf16 = cpu_adam.to_cpu_adam(torch.optim.AdamW(make_model().parameters()), bf16_states=True)
    assert type(bf16).__name__ == "DeepSpeedCPUAdam" and not cast(Any, bf16).fp32_optimizer_states
    zenflow = cpu_adam.to_cpu_adam(torch.optim.AdamW(make_model().parameters()), zenflow=True, overlap_step=True)
    assert type(zenflow).__name__ == "ZenFlowCPUAdam" and cast(Any, zenflow).overlap_step
    assert cast(Any, zenflow).fp32_optimizer_states


def test_the_deepspeed_swap_rule_needs_optimizer_offload_and_cpu_adam_for_offload() -> None:
    offload = DeepSpeedZeroConfig(offload_optimizer="cpu")
    for zero in (DeepSpeedZeroConfig(), DeepSpeedZeroConfig(offload_optimizer="cpu", cpu_adam_for_offload=False)):
        kept = torch.optim.AdamW(make_model().parameters())
        assert cpu_adam.for_deepspeed(kept, None, zero) is kept
    sgd = torch.optim.SGD(make_model().parameters(), lr=0.1)
    assert cpu_adam.for_deepspeed(sgd, None, offload) is sgd
    original = torch.optim.AdamW(make_model().parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(original, step_size=1)
    zenflow = offload.replace(zenflow=True)
    swapped = cpu_adam.for_deepspeed(original, scheduler, zenflow)
    assert type(swapped).__name__ == "ZenFlowCPUAdam" and scheduler.optimizer is swapped
