"""The one-card presets under Lightning Fabric, in one process on CPU: a plain Fabric loop trains as the Trainer's
``OneCardStrategy`` does on the same seed and data (bit-identical losses and weights), and as Fabric's own
single-device AdamW where the lever is exact (bit-identical too); checkpoints go both ways between Fabric and the
Trainer with the optimizer state; what the levers cannot give is one line."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_zero.errors import ZeroConfigError
from lightning_zero.fabric.onecard import FABRIC_FIXES, FabricOneCardStrategy
from lightning_zero.presets import build_fabric_preset, build_preset
from lightning_zero.strategies.onecard import OneCardStrategy, refuse_lever_conflicts
from lightning_zero.strategies.onecard_config import OneCardConfig
from tests.helpers.runif import RunIf
from tests.test_levers import TORCHAO

STEPS = 6
HALF = 3
IN_BACKWARD = {"optimizer_in_backward": True}
#: Both activation levers on: blocks checkpointed (torch's wrapper around each) and the forward under save_on_cpu.
#: torchao's CPU offload keeps tensors smaller than this (its ``minimal_size``) on the GPU, gradients included.
OFFLOADED_SIZE = 4096
ACTIVATIONS = {**IN_BACKWARD, "activation_checkpointing": True, "activation_offload": True}


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.linear(x))


class Regressor(pl.LightningModule):
    """The same module under the Trainer and under Fabric (so their checkpoints share keys): repeated blocks for
    activation checkpointing to find, the first layer of 4,096 weights (the size from which torchao quantizes
    states), AdamW with weight decay and a scheduler that changes the learning rate every step."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inner = nn.Linear(8, 64)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(64, 1)
        self.losses: list[float] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inner(x)
        for block in self.blocks:
            x = block(x)
        out: torch.Tensor = self.head(x)
        return out

    def training_step(self, batch: Any, _: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self) -> Any:
        optimizer, scheduler = optimizer_and_scheduler(self)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def optimizer_and_scheduler(module: nn.Module) -> tuple[torch.optim.AdamW, Any]:
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-2, weight_decay=0.1)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))


def batches(start: int = 0, stop: int = STEPS) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(STEPS * 8, 8, generator=generator)
    y = x.sum(1, keepdim=True)
    return [(x[i * 8 : (i + 1) * 8], y[i * 8 : (i + 1) * 8]) for i in range(start, stop)]


def weights(module: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in module.parameters()])


class FabricRun:
    """A plain Fabric loop over :func:`batches` ``[start:stop]``: what it recorded after each backward and step."""

    def __init__(
        self,
        strategy: Any,
        start: int = 0,
        stop: int = STEPS,
        load: Path | None = None,
        save: Path | None = None,
        check: Callable[[nn.Module], None] | None = None,
        accelerator: str = "cpu",
    ) -> None:
        fabric = L.Fabric(accelerator=accelerator, devices=1, strategy=strategy)
        self.module = Regressor()
        optimizer, scheduler = optimizer_and_scheduler(self.module)
        model, optimizer, scheduler = fabric.setup(self.module, optimizer, scheduler=scheduler)
        self.strategy = fabric.strategy
        if check is not None:
            check(model)
        state = {"model": model, "optimizer": optimizer, "scheduler": scheduler}
        self.remainder = fabric.load(load, state) if load is not None else {}
        self.losses: list[float] = []
        self.gradients_after_backward: list[bool] = []
        for x, y in fabric.to_device(batches(start, stop)):
            loss = F.mse_loss(model(x), y)
            fabric.backward(loss)
            large = [p for p in model.parameters() if p.numel() >= OFFLOADED_SIZE]  # the blocks' 64 x 64 weights
            self.gradients_after_backward.append(any(p.grad is not None for p in large))
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step()
            self.losses.append(loss.item())
        if save is not None:
            fabric.save(save, {**state, "step": stop})
        self.weights = weights(self.module).cpu()
        self.optimizer = optimizer.optimizer  # the one Fabric's wrapper steps
        fabric.strategy.teardown()


def fit(
    strategy: Any,
    start: int = 0,
    stop: int = STEPS,
    resume: Path | None = None,
    save: Path | None = None,
    accelerator: str = "cpu",
) -> Regressor:
    """The Trainer over :func:`batches` ``[start:stop]`` (its loop counters start at 0 from a Fabric checkpoint)."""
    module = Regressor()
    loader = DataLoader(TensorDataset(*map(torch.cat, zip(*batches(start, stop), strict=True))), batch_size=8)
    trainer = pl.Trainer(
        accelerator=accelerator,
        strategy=strategy,
        max_steps=stop - start,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, loader, ckpt_path=resume)
    if save is not None:
        trainer.save_checkpoint(save)
    return module


def test_the_one_card_presets_build_the_fabric_strategy_by_name_with_the_trainers_settings() -> None:
    for name in ("onecard_step_in_backward", "onecard_adamw8bit"):
        strategy = L.Fabric(accelerator="cpu", strategy=name).strategy
        assert isinstance(strategy, FabricOneCardStrategy) and strategy.root_device == torch.device("cpu")
        assert strategy.zero == build_preset(name).zero == build_fabric_preset(name).zero


@pytest.mark.parametrize("levers", [IN_BACKWARD, ACTIVATIONS], ids=["step_in_backward", "with_activation_levers"])
def test_the_step_in_backward_trains_as_the_trainer_and_as_plain_adamw(
    levers: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bit-identical to the Trainer's OneCardStrategy with the same levers, and to Fabric's own AdamW (on CPU
    torch's AdamW steps one parameter at a time anyway); every gradient freed inside backward (Fabric's plain AdamW
    keeps them). With the activation levers: each block checkpointed and every forward under ``save_on_cpu``."""
    entered: list[bool] = []
    real = torch.autograd.graph.save_on_cpu

    def counting(pin_memory: bool = False) -> Any:
        entered.append(pin_memory)
        return real(pin_memory=pin_memory)

    def checkpointed(model: nn.Module) -> None:
        wrapped = [type(module).__name__ for module in model.modules() if type(module).__name__ == "CheckpointWrapper"]
        assert len(wrapped) == (2 if levers.get("activation_checkpointing") else 0)

    monkeypatch.setattr(torch.autograd.graph, "save_on_cpu", counting)
    ours = FabricRun(build_fabric_preset("onecard_step_in_backward", **levers), check=checkpointed)
    assert entered == [False] * (STEPS if levers.get("activation_offload") else 0)
    trainer = fit(OneCardStrategy(levers, device="cpu"))
    plain = FabricRun("auto")
    assert ours.losses == trainer.losses
    torch.testing.assert_close(ours.weights, weights(trainer), rtol=0, atol=0)
    assert ours.losses == plain.losses
    torch.testing.assert_close(ours.weights, plain.weights, rtol=0, atol=0)
    assert ours.gradients_after_backward == [False] * STEPS and plain.gradients_after_backward == [True] * STEPS
    assert not torch.equal(ours.weights, weights(Regressor()))


@pytest.mark.slow  # torchao compiles its 8-bit step (~10 s here)
@TORCHAO
def test_torchao_8bit_adamw_trains_as_the_trainer_and_close_to_exact_adamw() -> None:
    """``onecard_adamw8bit``: 8-bit states (torchao's subclass), bit-identical to the Trainer's run; weights within
    2% of exact AdamW's (relative to how far training moved them)."""
    from torchao.optim.subclass_8bit import OptimState8bit

    strategy = build_fabric_preset("onecard_adamw8bit")
    ours = FabricRun(strategy)
    states = [state for inner, _ in ours.optimizer.inners for state in inner.state.values()]
    assert any(isinstance(state["exp_avg"], OptimState8bit) for state in states)
    trainer = fit(OneCardStrategy(build_preset("onecard_adamw8bit").zero, device="cpu"))
    plain = FabricRun("auto")
    assert ours.losses == trainer.losses
    torch.testing.assert_close(ours.weights, weights(trainer), rtol=0, atol=0)
    moved = (plain.weights - weights(Regressor())).norm()
    assert 0 < (ours.weights - plain.weights).norm() / moved < 0.02


def test_a_checkpoint_resumes_from_fabric_under_the_trainer_and_back_with_the_optimizer_state(tmp_path: Path) -> None:
    """Saved after 3 steps, resumed for 3 more on the next batches (the activation levers on, so the blocks are
    wrapped): the losses and weights equal the uninterrupted run's bit for bit, both ways (a lost Adam state or
    learning rate would not); the file holds the module's own keys under the Trainer's names."""
    whole = FabricRun(build_fabric_preset("onecard_step_in_backward", **ACTIVATIONS))
    FabricRun(build_fabric_preset("onecard_step_in_backward", **ACTIVATIONS), stop=HALF, save=tmp_path / "fabric.ckpt")
    saved = torch.load(tmp_path / "fabric.ckpt", weights_only=False)
    assert saved["state_dict"].keys() == Regressor().state_dict().keys() and saved["step"] == HALF
    assert len(saved["optimizer_states"]) == 1 and len(saved["lr_schedulers"]) == 1

    trainer = fit(OneCardStrategy(ACTIVATIONS, device="cpu"), start=HALF, resume=tmp_path / "fabric.ckpt")
    assert trainer.losses == whole.losses[HALF:]
    torch.testing.assert_close(weights(trainer), whole.weights, rtol=0, atol=0)

    fit(OneCardStrategy(ACTIVATIONS, device="cpu"), stop=HALF, save=tmp_path / "trainer.ckpt")
    fabric = FabricRun(
        build_fabric_preset("onecard_step_in_backward", **ACTIVATIONS), start=HALF, load=tmp_path / "trainer.ckpt"
    )
    assert fabric.losses == whole.losses[HALF:] and fabric.remainder["global_step"] == HALF
    torch.testing.assert_close(fabric.weights, whole.weights, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("fabric", "message"),
    [
        ({"devices": 2, "strategy": "onecard_step_in_backward"}, "train on one device, got 2: pass `devices=1`"),
        ({"num_nodes": 2, "strategy": "onecard_adamw8bit"}, "train on one device, got 2: pass `devices=1`"),
        ({"strategy": "onecard_offload"}, "runs on CUDA GPUs only, got cpu"),
    ],
    ids=["two_devices", "two_nodes", "offload_on_cpu"],
)
def test_what_one_card_cannot_be_is_one_line_when_the_fabric_is_built(fabric: dict[str, Any], message: str) -> None:
    with pytest.raises(ZeroConfigError, match=message) as error:
        L.Fabric(accelerator="cpu", **fabric)
    assert "\n" not in str(error.value)


def test_the_trainers_one_card_strategy_refuses_the_cpu_offload_off_cuda_in_one_line_too() -> None:
    """The rule both strategies call (torchao's own refusal is an assertion's traceback)."""
    with pytest.raises(ZeroConfigError, match="runs on CUDA GPUs only, got cpu") as error:
        fit(OneCardStrategy({"offload_optimizer": "cpu"}, device="cpu"))
    assert "\n" not in str(error.value)


def _two_optimizers(fabric: L.Fabric, model: Regressor) -> None:
    fabric.setup(model, torch.optim.AdamW(model.inner.parameters()), torch.optim.AdamW(model.head.parameters()))


def _clip(by_value: bool) -> Callable[[L.Fabric, Regressor], None]:
    def clip(fabric: L.Fabric, model: Regressor) -> None:
        model, optimizer = fabric.setup(model, torch.optim.AdamW(model.parameters()))
        fabric.backward(model(fabric.to_device(batches()[0][0])).sum())
        if by_value:
            fabric.clip_gradients(model, optimizer, clip_val=1.0)
        else:
            fabric.clip_gradients(model, optimizer, max_norm=1.0)

    return clip


def _accumulate(fabric: L.Fabric, model: Regressor) -> None:
    model, _ = fabric.setup(model, torch.optim.AdamW(model.parameters()))
    (x, _), (second, _) = fabric.to_device(batches(0, 2))
    fabric.backward(model(x).sum())
    fabric.backward(model(second).sum())


@pytest.mark.parametrize(
    ("loop", "message"),
    [
        (_two_optimizers, "replace one optimizer, got 2: set up one optimizer with `fabric.setup`"),
        (_clip(by_value=False), "cannot be clipped: remove `fabric.clip_gradients`"),
        (_clip(by_value=True), "cannot be clipped: remove `fabric.clip_gradients`"),
        (_accumulate, r"none can accumulate: call `optimizer.step\(\)` after each `fabric.backward`"),
    ],
    ids=["two_optimizers", "clip_norm", "clip_value", "accumulate"],
)
def test_what_the_step_in_backward_cannot_give_a_fabric_loop_is_one_line(
    loop: Callable[[L.Fabric, Regressor], None], message: str
) -> None:
    fabric = L.Fabric(accelerator="cpu", strategy="onecard_step_in_backward")
    with pytest.raises(ZeroConfigError, match=message) as error:
        loop(fabric, Regressor())
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("loop", "message"),
    [
        ({"clipping": True}, "before any clipping could touch it: remove `fabric.clip_gradients`"),
        ({"accumulating": True}, r"none can accumulate: call `optimizer.step\(\)` after each `fabric.backward`"),
    ],
)
def test_what_the_cpu_offload_cannot_give_a_fabric_loop_is_one_line(loop: dict[str, Any], message: str) -> None:
    """The CUDA-only lever's refusals, from the rule the Fabric strategy calls (its gradients go to the host as they
    complete)."""
    with pytest.raises(ZeroConfigError, match=message) as error:
        refuse_lever_conflicts(OneCardConfig(offload_optimizer="cpu"), FABRIC_FIXES, **loop)
    assert "\n" not in str(error.value)


def test_teardown_takes_the_step_in_backward_off_the_parameters() -> None:
    """After ``teardown`` a backward leaves the gradients and the weights as they are (the per-parameter hooks that
    stepped and freed them are gone)."""
    run = FabricRun(build_fabric_preset("onecard_step_in_backward"), stop=1)
    assert run.gradients_after_backward == [False]
    run.module(batches()[0][0]).sum().backward()
    assert all(p.grad is not None for p in run.module.parameters())
    torch.testing.assert_close(weights(run.module), run.weights, rtol=0, atol=0)


@RunIf(min_cuda_gpus=1)
@TORCHAO
def test_torchao_cpu_offload_under_fabric_trains_as_the_trainer_on_cuda() -> None:
    """``onecard_offload`` on one GPU: bit-identical to the Trainer's run; Fabric's own AdamW on the GPU within 1e-5
    (AdamW on the host against the GPU's, as the Trainer's test allows); every gradient torchao offloads moved out
    inside backward."""
    ours = FabricRun("onecard_offload", accelerator="cuda")
    trainer = fit(OneCardStrategy({"offload_optimizer": "cpu"}, device="cuda:0"), accelerator="cuda")
    plain = FabricRun("auto", accelerator="cuda")
    assert ours.losses == trainer.losses
    torch.testing.assert_close(ours.weights, weights(trainer).cpu(), rtol=0, atol=0)
    torch.testing.assert_close(ours.weights, plain.weights, rtol=0, atol=1e-5)
    assert ours.gradients_after_backward == [False] * STEPS and plain.gradients_after_backward == [True] * STEPS


@RunIf(min_cuda_gpus=1)
@TORCHAO
@pytest.mark.parametrize(
    ("loop", "message"),
    [
        (_clip(by_value=False), "before any clipping could touch it: remove `fabric.clip_gradients`"),
        (_accumulate, r"none can accumulate: call `optimizer.step\(\)` after each `fabric.backward`"),
    ],
    ids=["clip", "accumulate"],
)
def test_what_the_cpu_offload_cannot_give_a_fabric_loop_on_cuda_is_one_line(
    loop: Callable[[L.Fabric, Regressor], None], message: str
) -> None:
    fabric = L.Fabric(accelerator="cuda", devices=1, strategy="onecard_offload")
    with pytest.raises(ZeroConfigError, match=message) as error:
        loop(fabric, Regressor())
    assert "\n" not in str(error.value)


def test_fp16_loss_scaling_under_the_step_in_backward_is_one_line_at_fabric_setup() -> None:
    from lightning.fabric.plugins.precision import MixedPrecision

    strategy = build_fabric_preset("onecard_step_in_backward")
    strategy.precision = MixedPrecision("16-mixed", "cuda")  # what Fabric gives on a GPU
    module = nn.Linear(4, 1)
    with pytest.raises(ZeroConfigError, match="use `bf16-mixed`") as error:
        strategy.setup_optimizer(torch.optim.AdamW(module.parameters()))
    assert "\n" not in str(error.value)
