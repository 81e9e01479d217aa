"""The one-card levers on CPU: the optimizer step in backward is exact AdamW (weights after several steps equal plain
training's, a scheduler moving the learning rate), its refusals are one line, torchao's 8-bit AdamW trains under
``approximate: true`` only, and activation offload wraps the forward."""

from __future__ import annotations

import importlib.util
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.strategies import SingleDeviceStrategy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_zero.errors import ZeroConfigError
from lightning_zero.presets import build_preset
from lightning_zero.strategies.onecard import OneCardStrategy
from lightning_zero.strategies.onecard_config import OneCardConfig
from tests.helpers.runif import RunIf

TORCHAO = pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="needs torchao")
STEPS = 6


class Regressor(pl.LightningModule):
    """Two layers (the first of 4,096 weights, the size from which torchao quantizes states), AdamW with weight
    decay and a scheduler that changes the learning rate every step."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 512), nn.Tanh(), nn.Linear(512, 1))
        self.grads_after_backward: list[bool] = []

    def training_step(self, batch: Any, _: int) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def on_after_backward(self) -> None:
        self.grads_after_backward.append(any(p.grad is not None for p in self.parameters()))

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-2, weight_decay=0.1)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def _loader() -> DataLoader[Any]:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(64, 8, generator=generator)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)


def _fit(strategy: Any, **trainer: Any) -> Regressor:
    module = Regressor()
    pl.Trainer(
        accelerator="cpu",
        strategy=strategy,
        max_steps=STEPS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **trainer,
    ).fit(module, _loader())
    return module


def _weights(module: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in module.parameters()])


def test_the_step_in_backward_is_exact_adamw_and_no_gradient_outlives_backward() -> None:
    """Same weights as plain AdamW after 6 steps with a per-step scheduler (1e-6: one parameter at a time sums in
    another order); Lightning's own step would have stepped twice and the weights would differ; each gradient is
    freed inside backward, so none is left when backward ends."""
    plain = _fit(SingleDeviceStrategy(device="cpu"))
    stepped = _fit(OneCardStrategy({"optimizer_in_backward": True}, device="cpu"))
    assert plain.grads_after_backward == [True] * STEPS
    assert stepped.grads_after_backward == [False] * STEPS
    torch.testing.assert_close(_weights(stepped), _weights(plain), rtol=0, atol=1e-6)
    assert not torch.equal(_weights(plain), _weights(Regressor()))


def _resumed(make: Any, directory: Any) -> torch.Tensor:
    """Weights after 3 steps, a saved checkpoint, and a resumed fit to ``STEPS`` (fresh strategy each time)."""
    trainer = pl.Trainer(
        accelerator="cpu",
        strategy=make(),
        max_steps=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Regressor(), _loader())
    trainer.save_checkpoint(directory / "half.ckpt")
    resumed = Regressor()
    pl.Trainer(
        accelerator="cpu",
        strategy=make(),
        max_steps=STEPS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    ).fit(resumed, _loader(), ckpt_path=directory / "half.ckpt")
    return _weights(resumed)


def test_a_resumed_step_in_backward_continues_as_plain_adamw_resumes(tmp_path: Any) -> None:
    """The replaced optimizer's state (each inner optimizer's, and the module optimizer's groups and scheduler) goes
    into the checkpoint and back: resumed at step 3, the weights at step 6 equal plain AdamW's resumed the same way
    (a lost Adam state or learning rate would not)."""
    (tmp_path / "plain").mkdir()
    (tmp_path / "ours").mkdir()
    plain = _resumed(lambda: SingleDeviceStrategy(device="cpu"), tmp_path / "plain")
    ours = _resumed(lambda: OneCardStrategy({"optimizer_in_backward": True}, device="cpu"), tmp_path / "ours")
    torch.testing.assert_close(ours, plain, rtol=0, atol=1e-6)


def test_the_preset_builds_the_one_card_strategy() -> None:
    strategy = build_preset("onecard_step_in_backward")
    assert isinstance(strategy, OneCardStrategy) and strategy.zero.optimizer_in_backward


@pytest.mark.parametrize(
    ("trainer", "message"),
    [
        ({"gradient_clip_val": 1.0}, "cannot be clipped"),
        ({"accumulate_grad_batches": 2}, "none can accumulate"),
    ],
)
def test_the_step_in_backward_refuses_clipping_and_accumulation(trainer: dict[str, Any], message: str) -> None:
    with pytest.raises(ZeroConfigError, match=message) as error:
        _fit(OneCardStrategy({"optimizer_in_backward": True}, device="cpu"), **trainer)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"low_memory_optimizer": "adamw8bit"}, "set `approximate: true`"),
        ({"stage": 2}, "set `stage: 0`"),
        ({"offload_optimizer": "nvme"}, "`cpu` only"),
        ({"offload_optimizer": "cpu", "optimizer_in_backward": True}, "set `optimizer_in_backward: false`"),
        ({"offload_optimizer": "cpu", "low_memory_optimizer": "adamw8bit", "approximate": True}, "choose one"),
        ({"low_memory_optimizer": "adam8", "approximate": True}, "must be one of"),
        ({"optimiser_in_backward": True}, "did you mean 'optimizer_in_backward'"),
    ],
)
def test_bad_lever_settings_are_one_line_naming_the_fix(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ZeroConfigError, match=message) as error:
        OneCardConfig.from_dict(fields)
    assert "\n" not in str(error.value)


def test_a_low_memory_optimizer_replaces_only_adamw() -> None:
    class SGDModule(Regressor):
        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    strategy = OneCardStrategy({"low_memory_optimizer": "adamw8bit", "approximate": True}, device="cpu")
    with pytest.raises(ZeroConfigError, match=r"replaces torch\.optim\.AdamW, got SGD"):
        pl.Trainer(accelerator="cpu", strategy=strategy, max_steps=1, logger=False, enable_progress_bar=False).fit(
            SGDModule(), _loader()
        )


@TORCHAO
def test_torchao_8bit_adamw_trains_close_to_exact_adamw() -> None:
    """Under ``approximate: true``, stepped in backward: 8-bit states (torchao's subclass), weights within 2% of
    exact AdamW's after 6 steps, and training moved them (the 8-bit step ran)."""
    from torchao.optim.subclass_8bit import OptimState8bit

    plain = _fit(SingleDeviceStrategy(device="cpu"))
    strategy = OneCardStrategy(
        {"optimizer_in_backward": True, "low_memory_optimizer": "adamw8bit", "approximate": True}, device="cpu"
    )
    approximate = _fit(strategy)
    (replaced,) = strategy.optimizers
    states = [state for inner, _ in replaced.inners for state in inner.state.values()]  # type: ignore[attr-defined]
    assert any(isinstance(state["exp_avg"], OptimState8bit) for state in states)
    difference = (_weights(approximate) - _weights(plain)).norm() / (_weights(plain) - _weights(Regressor())).norm()
    assert 0 < difference < 0.02, difference


def test_activation_offload_saves_the_forward_on_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """The forward runs inside torch's ``save_on_cpu`` (counted through the real one), with the same weights."""
    entered = []
    real = torch.autograd.graph.save_on_cpu

    def counting(pin_memory: bool = False) -> Any:
        entered.append(pin_memory)
        return real(pin_memory=pin_memory)

    monkeypatch.setattr(torch.autograd.graph, "save_on_cpu", counting)
    plain = _fit(SingleDeviceStrategy(device="cpu"))
    offloaded = _fit(OneCardStrategy({"activation_offload": True}, device="cpu"))
    assert entered == [False] * STEPS
    torch.testing.assert_close(_weights(offloaded), _weights(plain), rtol=0, atol=0)


@RunIf(min_cuda_gpus=1)
@TORCHAO
def test_torchao_cpu_offload_is_exact_adamw_on_cuda() -> None:
    plain = _fit_cuda(SingleDeviceStrategy(device="cuda:0"))
    offloaded = _fit_cuda(OneCardStrategy({"offload_optimizer": "cpu"}, device="cuda:0"))
    torch.testing.assert_close(_weights(offloaded).cpu(), _weights(plain).cpu(), rtol=0, atol=1e-5)


@TORCHAO
@RunIf(min_cuda_gpus=1)
def test_a_model_the_cpu_offload_optimizer_stepped_is_freed_once_its_hooks_are_released() -> None:
    import gc
    import weakref

    from lightning_zero.strategies.onecard_optim import replace_optimizer

    model = nn.Linear(256, 256, device="cuda")
    optimizer = replace_optimizer(torch.optim.AdamW(model.parameters()), OneCardConfig(offload_optimizer="cpu"), True)
    model(torch.randn(4, 256, device="cuda")).sum().backward()
    optimizer.step()
    weight = weakref.ref(model.weight)
    optimizer.remove_hooks()
    del model, optimizer
    gc.collect()
    assert weight() is None  # torchao's own hook held it through autograd, out of the collector's sight


def _fit_cuda(strategy: Any) -> Regressor:
    module = Regressor()
    pl.Trainer(
        accelerator="cuda",
        devices=1,
        strategy=strategy,
        max_steps=STEPS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
    ).fit(module, _loader())
    return module


# zero_auto's one-card candidates


def _plan_row(layout: Any, max_micro_batch: int) -> Any:
    from lightning_zero.auto.plan import PlanRow
    from lightning_zero.memory.states import ModelStates

    states = ModelStates(local_parameters=1, optimizer_state=2, device_bytes=0, host_bytes=0, deepspeed_estimate=False)
    return PlanRow(layout, states, 0, 1, max_micro_batch, fits=max_micro_batch > 0)


def test_one_card_candidates_take_each_lever_set_at_its_least_saving_variant_that_fits_a_whole_step() -> None:
    from lightning_zero.auto.plan import candidate_layouts
    from lightning_zero.auto.search import OneCardRules, candidates

    fits = {"onecard_step_in_backward+ckpt": 16, "onecard_step_in_backward+ckpt+act_offload": 64}
    fits |= {"onecard_offload": 16, "onecard_adamw8bit+ckpt+act_offload": 32, "onecard_adamw8bit+ckpt": 8}
    fits |= {"zero2_offload": 16}
    rows = [_plan_row(layout, fits.get(layout.name, 0)) for layout in candidate_layouts()]

    def names(rules: OneCardRules | None, world_size: int = 1, global_batch: int | str = 16) -> list[str]:
        found = candidates(rows, world_size, global_batch, 10**6, True, max_trials=4, onecard=rules)
        return [c.name for c in found]

    exact = OneCardRules(on_cuda=True, approximate=False, precision="bf16-mixed")
    assert names(exact) == ["onecard_step_in_backward+ckpt 16x1", "onecard_offload 16x1", "zero2_offload 16x1 pinned"]
    approximate = OneCardRules(on_cuda=True, approximate=True, precision="bf16-true")
    assert "onecard_adamw8bit+ckpt+act_offload 16x1 ~" in names(approximate)  # 8 samples would need accumulation
    assert names(OneCardRules(on_cuda=False, approximate=False, precision="32-true"))[:1] == [
        "onecard_step_in_backward+ckpt 16x1"  # torchao's CPUOffloadOptimizer is for CUDA only
    ]
    assert names(OneCardRules(on_cuda=True, approximate=True, precision="16-mixed")) == ["zero2_offload 16x1 pinned"]
    assert names(exact, world_size=2) == names(None, world_size=2) == ["zero2_offload 8x1 pinned"]
    assert names(exact, global_batch="max")[0] == "onecard_step_in_backward+ckpt 16x1"  # its own largest


def test_one_card_model_states_free_each_gradient_and_move_the_optimizer_as_the_levers_say() -> None:
    from lightning_zero.memory.states import Layout, ParameterShapes, model_states

    shapes = ParameterShapes(shapes=((1000, 1000),), largest_layer=10**6)
    n = 10**6

    def states(precision: str, **levers: Any) -> tuple[int, int]:
        found = model_states(shapes, Layout("onecard", 0, **levers), devices=1, precision=precision)
        return found.device_bytes, found.host_bytes

    assert states("32-true") == (4 * n + 4 * n + 8 * n, 0)  # parameters, gradients, two fp32 Adam states
    assert states("bf16-true", optimizer_in_backward=True) == (2 * n + 2 * n + 4 * n, 0)  # one layer's gradient
    assert states("bf16-mixed", offload_optimizer=True) == (4 * n + 4 * n, 8 * n + 2 * 4 * n)
    assert states("bf16-true", optimizer_in_backward=True, low_memory_optimizer="adamw8bit") == (6 * n, 0)


def test_a_one_card_layout_is_named_after_its_preset_and_runs_as_its_config() -> None:
    from lightning_zero.auto.search import Candidate
    from lightning_zero.auto.strategy import AutoZeroConfig, candidate_onecard
    from lightning_zero.memory.states import Layout

    layout = Layout("onecard", 0, optimizer_in_backward=True, low_memory_optimizer="adamw8bit")
    offloaded = Layout("onecard", 0, offload_optimizer=True, activation_checkpointing=True, activation_offload=True)
    assert (layout.name, offloaded.name) == ("onecard_adamw8bit", "onecard_offload+ckpt+act_offload")
    candidate = Candidate(offloaded, micro_batch=16, accumulation=1, pin_memory=False, bucket_size=0)
    config = candidate_onecard(AutoZeroConfig(memory_budget_gib=24, expandable_segments=False), candidate)
    assert config == OneCardConfig(
        offload_optimizer="cpu",
        activation_checkpointing=True,
        activation_offload=True,
        memory_budget_gib=24,
        expandable_segments=False,
    )
    approximate = Candidate(layout, micro_batch=16, accumulation=1, pin_memory=False, bucket_size=0)
    with pytest.raises(ZeroConfigError, match="only with `approximate: true`"):
        candidate_onecard(AutoZeroConfig(), approximate)
    assert candidate_onecard(AutoZeroConfig(approximate=True), approximate).low_memory_optimizer == "adamw8bit"


@pytest.fixture(scope="module")
def auto_on_one_card(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    import json
    from pathlib import Path

    from tests.helpers.launch import run_script

    out = tmp_path_factory.mktemp("onecard_auto")
    run_script(Path(__file__).parent / "helpers" / "onecard_auto_run.py", str(out), timeout=400)
    return {name: json.loads((out / f"{name}.json").read_text()) for name in ("search", "cached", "plain")}


@pytest.mark.multiprocess
def test_zero_auto_times_the_one_card_levers_beside_deepspeed_and_trains_with_the_fastest(
    auto_on_one_card: dict[str, dict[str, Any]],
) -> None:
    searched = auto_on_one_card["search"]
    tried = {name: (fits, rate) for name, fits, rate, _ in searched["tried"]}
    assert tried["onecard_step_in_backward 4x1"][0] and tried["zero2 4x1"][0], searched["tried"]
    assert searched["chosen"] == max(tried, key=lambda name: tried[name][1])
    handed_over = searched["chosen"].startswith("onecard")
    assert searched["trained_by"] == ("ChosenOneCard" if handed_over else "ZeroAutoStrategy")
    assert len(searched["losses"]) == 4 and searched["hooks_left"] == 0
    assert searched["run_samples_per_sec"] > 0  # the run's own rate, said beside its trial's


@pytest.mark.multiprocess
def test_a_run_handed_to_a_one_card_lever_trains_as_that_preset_by_name(
    auto_on_one_card: dict[str, dict[str, Any]],
) -> None:
    cached, plain = auto_on_one_card["cached"], auto_on_one_card["plain"]
    assert cached["from_cache"] and cached["trained_by"] == "ChosenOneCard" and plain["trained_by"] == "OneCardStrategy"
    assert not cached["timed"]  # no trial ran to compare the run with
    assert cached["search_reachable"]  # trainer.strategy leads back to the search that chose it
    assert cached["losses"] == plain["losses"] and cached["weights"] == plain["weights"]  # the same steps, bit for bit
    assert not cached["process_group_left"] and cached["hooks_left"] == 0  # the trials' DeepSpeed world ended


@pytest.mark.parametrize("fields", [{"optimizer_in_backward": True}, {"offload_optimizer": "cpu"}])
def test_fp16_loss_scaling_under_a_lever_that_takes_gradients_in_backward_is_one_line(fields: dict[str, Any]) -> None:
    from lightning_zero.strategies.onecard import TRAINER_FIXES, refuse_lever_conflicts

    with pytest.raises(ZeroConfigError, match="use `bf16-mixed`") as error:
        refuse_lever_conflicts(OneCardConfig(**fields), TRAINER_FIXES, precision="16-mixed")
    assert "\n" not in str(error.value)
    refuse_lever_conflicts(OneCardConfig(**fields), TRAINER_FIXES, precision="bf16-mixed")


def test_fp16_loss_scaling_with_gradients_kept_to_the_step_is_taken() -> None:
    """CPU offload under accumulation keeps the gradients on the device for the scaler to unscale."""
    from lightning_zero.strategies.onecard import TRAINER_FIXES, refuse_lever_conflicts

    config = OneCardConfig(offload_optimizer="cpu")
    refuse_lever_conflicts(config, TRAINER_FIXES, precision="16-mixed", offload_gradients=False)
