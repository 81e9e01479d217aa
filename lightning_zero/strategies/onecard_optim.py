"""The optimizers of the one-card levers: the module's own optimizer stepped in backward, or replaced by one with
smaller or offloaded states (torchao, bitsandbytes), behind one optimizer that Lightning and the schedulers see."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from typing import Any

import torch

from lightning_zero.errors import ZeroConfigError
from lightning_zero.strategies.onecard_config import OneCardConfig

#: The hyper-parameters a scheduler may move, copied from the module's groups to the inner optimizers before a step.
HYPER_PARAMETERS = ("lr", "betas", "eps", "weight_decay")

#: ``low_memory_optimizer`` -> (package, class): each is AdamW's update with smaller states.
LOW_MEMORY_CLASSES = {
    "adamw8bit": ("torchao.optim", "AdamW8bit"),
    "adamw4bit": ("torchao.optim", "AdamW4bit"),
    "adamw_bf16": ("lightning_zero.internals", "torchao_adamw"),
    "paged_adamw8bit": ("bitsandbytes.optim", "PagedAdamW8bit"),
}
_EXTRA = {"torchao.optim": "torchao", "lightning_zero.internals": "torchao", "bitsandbytes.optim": "bitsandbytes"}


def _import_class(module: str, name: str, lever: str) -> Any:
    try:
        if module == "lightning_zero.internals":  # a private class, reached through a function there
            return getattr(importlib.import_module(module), name)()
        return getattr(importlib.import_module(module), name)
    except ImportError:
        raise ZeroConfigError(f"`{lever}` needs {_EXTRA[module]}: pip install 'lightning-zero[onecard]'.") from None


def _adamw_hyper(group: dict[str, Any]) -> dict[str, Any]:
    return {key: group[key] for key in HYPER_PARAMETERS}


def _copy_hyper(source: dict[str, Any], target: dict[str, Any]) -> None:
    for key in HYPER_PARAMETERS:
        if key not in target:
            continue
        current = target[key]
        if isinstance(current, torch.Tensor):  # torchao keeps lr as a tensor and refuses a float put in its place
            current.fill_(source[key])
        else:
            target[key] = source[key]


class ReplacedOptimizer(torch.optim.Optimizer):
    """The one optimizer Lightning and the schedulers see in place of the module's own ``source``.

    Its ``param_groups`` are ``source``'s (the same list, so a scheduler built on either moves both); the updates are
    made by inner optimizers, each over some parameters of one of those groups, whose hyper-parameters are copied
    from that group before each of their steps. With ``in_backward`` each inner optimizer holds one parameter and
    steps from that parameter's post-accumulate-grad hook, then frees its gradient; :meth:`step` only runs the
    closure (forward and backward), so Lightning's own step does not step twice.
    """

    def __init__(
        self, source: torch.optim.Optimizer, inners: list[tuple[Any, dict[str, Any]]], in_backward: bool
    ) -> None:
        super().__init__([{"params": group["params"]} for group in source.param_groups], source.defaults)
        self.param_groups = source.param_groups
        self.source = source
        self.inners = inners
        self.in_backward = in_backward
        self._hooks: list[Any] = []
        if in_backward:
            for inner, group in inners:
                (parameter,) = inner.param_groups[0]["params"]
                self._hooks.append(parameter.register_post_accumulate_grad_hook(self._stepper(inner, group)))

    @staticmethod
    def _stepper(inner: Any, group: dict[str, Any]) -> Callable[[torch.Tensor], None]:
        def step_parameter(_: torch.Tensor) -> None:
            _step_inner(inner, group)
            inner.zero_grad(set_to_none=True)

        return step_parameter

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if not self.in_backward:
            for inner, group in self.inners:
                _step_inner(inner, group)
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for inner, _ in self.inners:
            inner.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {"inner": [inner.state_dict() for inner, _ in self.inners], "source": self.source.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if len(state_dict.get("inner", ())) != len(self.inners):
            raise ZeroConfigError(
                "This optimizer state was saved with another one-card optimizer layout: resume with the same"
                " `optimizer_in_backward`, `low_memory_optimizer` and `offload_optimizer`."
            )
        # Into the shared groups in place: the module optimizer's own load_state_dict would put new group dicts in
        # its place, which its scheduler would then move while the inner optimizers read the old ones.
        for group, saved in zip(self.source.param_groups, state_dict["source"]["param_groups"], strict=True):
            group.update({key: value for key, value in saved.items() if key != "params"})
        for (inner, _), saved in zip(self.inners, state_dict["inner"], strict=True):
            inner.load_state_dict(saved)

    def remove_hooks(self) -> None:
        """Take the per-parameter hooks off the parameters and let go of them (the strategy's teardown, a trial's end).

        torchao's ``CPUOffloadOptimizer`` keeps no handle of the post-accumulate-grad hook it puts on each parameter,
        and that hook holds the optimizer, which maps each parameter to its host copy: a cycle through autograd's C++
        side, which the garbage collector cannot see, so a model it optimized would never be freed (a zero_auto trial
        of a 3B model left 12.8 GB of the GPU and its pinned host copies behind). Emptying its maps breaks the cycle.
        """
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        for inner, _ in self.inners:
            for mapping in ("param_d2h_map", "optim_dict", "queue"):
                getattr(inner, mapping, {}).clear()


def _step_inner(inner: Any, group: dict[str, Any]) -> None:
    for inner_group in inner.param_groups:
        _copy_hyper(group, inner_group)
    inner.step()


def _trainable(group: dict[str, Any]) -> list[torch.nn.Parameter]:
    return [parameter for parameter in group["params"] if parameter.requires_grad]


def _require_adamw(source: torch.optim.Optimizer, lever: str) -> None:
    if type(source) is not torch.optim.AdamW:
        raise ZeroConfigError(
            f"`{lever}` replaces torch.optim.AdamW, got {type(source).__name__}: return torch.optim.AdamW from"
            " configure_optimizers, or turn the lever off."
        )


def _low_memory_inner(config: OneCardConfig, groups: Iterable[dict[str, Any]]) -> Any:
    module, name = LOW_MEMORY_CLASSES[config.low_memory_optimizer]
    cls = _import_class(module, name, f"low_memory_optimizer: {config.low_memory_optimizer}")
    extra = {"bf16_stochastic_round": True} if _EXTRA[module] == "torchao" else {}
    groups = list(groups)
    bf16 = all(p.dtype == torch.bfloat16 for group in groups for p in group["params"])
    if config.low_memory_optimizer == "adamw_bf16" and not bf16:
        raise ZeroConfigError(
            "`low_memory_optimizer: adamw_bf16` keeps its states in the parameters' dtype, and they are not"
            " bfloat16: use precision 'bf16-true', or `adamw8bit`."
        )
    return cls(groups, **extra)


def replace_optimizer(
    source: torch.optim.Optimizer, config: OneCardConfig, offload_gradients: bool
) -> ReplacedOptimizer:
    """The optimizer ``config`` asks for in place of the module's ``source`` (exact unless ``config.approximate``)."""
    in_backward = config.optimizer_in_backward
    inners: list[tuple[Any, dict[str, Any]]] = []
    for group in source.param_groups:
        parameters = _trainable(group)
        if not parameters:
            continue
        if config.offload_optimizer == "cpu":
            _require_adamw(source, "offload_optimizer: cpu")
            offload = _import_class("torchao.optim", "CPUOffloadOptimizer", "offload_optimizer: cpu")
            inner = offload(
                [{"params": parameters, **_adamw_hyper(group)}],
                torch.optim.AdamW,
                offload_gradients=offload_gradients,
            )
            inners.append((inner, group))
        elif config.low_memory_optimizer != "none":
            _require_adamw(source, f"low_memory_optimizer: {config.low_memory_optimizer}")
            hyper = {**_adamw_hyper(group), "amsgrad": group.get("amsgrad", False)}
            chunks = [[p] for p in parameters] if in_backward else [parameters]
            inners.extend((_low_memory_inner(config, [{"params": chunk, **hyper}]), group) for chunk in chunks)
        else:
            hyper = {key: value for key, value in group.items() if key not in ("params", "initial_lr")}
            chunks = [[p] for p in parameters] if in_backward else [parameters]
            same_class: Any = type(source)
            inners.extend((same_class([{"params": chunk, **hyper}]), group) for chunk in chunks)
    return ReplacedOptimizer(source, inners, in_backward)
