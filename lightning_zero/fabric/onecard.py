"""The one-card presets under Lightning Fabric: one device, no sharding, the Trainer's one-card levers.

A thin layer over Fabric's ``SingleDeviceStrategy`` with the pieces of the Trainer's
:class:`~lightning_zero.strategies.onecard.OneCardStrategy`: the typed :class:`OneCardConfig`, the memory budget's
cap and expandable segments, block preparation, the optimizer replaced by the levers (step in backward, torchao's
CPU offload or low-memory AdamW), the forward under ``save_on_cpu`` with ``activation_offload``, and the Trainer's
one-card checkpoint file (the user's module's ``state_dict``, the replaced optimizer's state under
``optimizer_states``, LR schedulers under ``lr_schedulers``), so a run resumes under either. What the Trainer refuses
from its flags is refused here from the loop's calls: a second optimizer at ``fabric.setup``, ``fabric.clip_gradients``
and a second ``fabric.backward`` before ``optimizer.step()`` where the levers leave no gradient to clip or accumulate,
and more than one device or node when the ``Fabric`` is built.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.strategies import SingleDeviceStrategy
from torch import Tensor, nn
from torch.optim import Optimizer

from lightning_zero.checkpoint.manifest import checkpoint_manifest
from lightning_zero.checkpoint.validate import check_checkpoint
from lightning_zero.checkpoint.weights_only import WEIGHTS_ONLY_KEY, weights_only_of_another_backend
from lightning_zero.errors import ZeroConfigError
from lightning_zero.fabric.trainer_format import (
    OPTIMIZERS,
    WEIGHTS,
    load_with_schedulers,
    optimizers_of,
    plain,
    restore_entries,
    saved_optimizer_states,
    the_module,
    with_trainer_keys,
)
from lightning_zero.internals import fabric_num_nodes
from lightning_zero.runtime.blocks import prepare_blocks
from lightning_zero.strategies.onecard import (
    LeverFixes,
    check_device_for_levers,
    gradients_leave_in_backward,
    lever_device,
    refuse_lever_conflicts,
    replaces_optimizer,
    saved_tensors_context,
    set_up_device,
    tear_down_levers,
)
from lightning_zero.strategies.onecard_config import OneCardConfig
from lightning_zero.strategies.onecard_optim import ReplacedOptimizer, replace_optimizer

#: The Fabric loop's ways out of what the levers cannot give.
FABRIC_FIXES = LeverFixes(
    one_optimizer="set up one optimizer with `fabric.setup`",
    no_clipping="remove `fabric.clip_gradients`",
    no_accumulation="call `optimizer.step()` after each `fabric.backward` (a larger micro-batch)",
)


class FabricOneCardStrategy(SingleDeviceStrategy):
    """One device with the levers of ``zero`` (a :class:`OneCardConfig` or its fields), for ``Fabric(strategy=...)``.

    Args:
        zero: The one-card settings, as for the Trainer's ``OneCardStrategy``.
        device: The device; Fabric's (``accelerator``, ``devices``) unless given.
        accelerator: Set by Fabric.
        checkpoint_io: Set by Fabric.
        precision: Set by Fabric.
    """

    zero_backend = "onecard"

    def __init__(
        self,
        zero: OneCardConfig | Mapping[str, Any] | None = None,
        device: str | torch.device | None = None,
        accelerator: Any = None,
        checkpoint_io: Any = None,
        precision: Any = None,
    ) -> None:
        self.zero = OneCardConfig.coerce(zero)
        super().__init__(
            device=lever_device(device), accelerator=accelerator, checkpoint_io=checkpoint_io, precision=precision
        )
        self._device_given = device is not None
        self._fabric_devices: list[torch.device] | None = None
        self.replaced: list[ReplacedOptimizer] = []  # what setup_optimizer made
        self._allocator_before: str | None = None
        self._set_up_device = False
        self._backwards_since_step = 0

    @property
    def root_device(self) -> torch.device:
        """The one device: the one given, else the one Fabric chose."""
        if self._device_given or not self._fabric_devices:
            return super().root_device
        return lever_device(self._fabric_devices[0])

    @property
    def parallel_devices(self) -> list[torch.device] | None:
        """The devices Fabric chose (its connector hands them to a strategy with this attribute), ``None`` before."""
        return self._fabric_devices

    @parallel_devices.setter
    def parallel_devices(self, devices: list[torch.device]) -> None:
        self._fabric_devices = [torch.device(device) for device in devices]

    @property
    def num_nodes(self) -> int:
        """The nodes Fabric was asked for (1 is all this strategy runs on)."""
        return fabric_num_nodes(self)

    def _configure_launcher(self) -> None:
        # The last call of `Fabric(...)`'s set-up, once the devices and nodes are known: refused before any launch.
        devices = len(self._fabric_devices or [self.root_device]) * self.num_nodes
        if devices != 1:
            raise ZeroConfigError(
                f"The one-card presets train on one device, got {devices}: pass `devices=1` (and `num_nodes=1`) to"
                " Fabric, or use a ZeRO preset such as `zero2` for several."
            )
        check_device_for_levers(self.zero, self.root_device)
        super()._configure_launcher()

    def setup_module(self, module: nn.Module) -> nn.Module:
        """The memory budget's cap and expandable segments (once), the blocks prepared, and under
        ``activation_offload`` the module in :class:`OffloadedActivations`."""
        if not self._set_up_device:
            self._allocator_before = set_up_device(self.zero, self.root_device)
            self._set_up_device = True
        prepare_blocks(module, self.zero.activation_checkpointing, self.zero.compile_blocks)
        return OffloadedActivations(module, self.zero, self.root_device) if self.zero.activation_offload else module

    def setup_optimizer(self, optimizer: Optimizer) -> Optimizer:
        """``optimizer`` replaced as the levers say (as it is when none replaces it); a second one is refused. A
        scheduler made on ``optimizer`` moves the replacement too: they share their parameter groups."""
        if not replaces_optimizer(self.zero):
            return optimizer
        optimizers = len(self.replaced) + 1
        refuse_lever_conflicts(self.zero, FABRIC_FIXES, optimizers, precision=str(self.precision.precision))
        replaced = replace_optimizer(optimizer, self.zero, offload_gradients=True)
        self.replaced.append(replaced)
        return replaced

    def backward(self, tensor: Tensor, module: nn.Module | None, *args: Any, **kwargs: Any) -> None:
        """Fabric's backward; a second one before ``optimizer.step()`` is refused where gradients leave backward as
        soon as they are complete (they would not accumulate)."""
        if (
            self._backwards_since_step
            and self.replaced
            and gradients_leave_in_backward(self.zero, offload_gradients=True)
        ):
            refuse_lever_conflicts(self.zero, FABRIC_FIXES, accumulating=True)
        self._backwards_since_step += 1
        super().backward(tensor, module, *args, **kwargs)

    def optimizer_step(self, optimizer: Any, **kwargs: Any) -> Any:
        """Fabric's step (``optimizer.step()``), after which a backward may come again."""
        self._backwards_since_step = 0
        return super().optimizer_step(optimizer, **kwargs)

    def clip_gradients_norm(
        self,
        module: nn.Module,
        optimizer: Optimizer,
        max_norm: float | int,
        norm_type: float | int = 2.0,
        error_if_nonfinite: bool = True,
    ) -> Tensor:
        """Fabric's clipping, refused where the levers leave no whole set of gradients to clip."""
        refuse_lever_conflicts(self.zero, FABRIC_FIXES, clipping=True)
        return super().clip_gradients_norm(module, optimizer, max_norm, norm_type, error_if_nonfinite)

    def clip_gradients_value(self, module: nn.Module, optimizer: Optimizer, clip_val: float | int) -> None:
        """As :meth:`clip_gradients_norm`."""
        refuse_lever_conflicts(self.zero, FABRIC_FIXES, clipping=True)
        super().clip_gradients_value(module, optimizer, clip_val)

    def save_checkpoint(
        self, path: Any, state: dict[str, Any], storage_options: Any = None, filter: Any = None
    ) -> None:
        """The Trainer's one-card checkpoint file: the user's module's ``state_dict`` (its own keys), each
        optimizer's state under ``optimizer_states``, LR schedulers under ``lr_schedulers``, the other entries by
        their names; written as the Trainer's strategy writes it (its ``CheckpointIO``, no manifest)."""
        if filter is not None:
            raise ZeroConfigError("The one-card presets save whole checkpoints: remove `filter` from `fabric.save`.")
        module_key, model = the_module(state)
        optimizers = optimizers_of(state)
        taken = {module_key, *(key for key, _ in optimizers)}
        rest = {key: value for key, value in state.items() if key not in taken}
        clash = sorted({WEIGHTS, OPTIMIZERS} & rest.keys())
        if clash:
            raise ZeroConfigError(
                f"The state's entries {clash} are the Trainer's names for the model and optimizers: rename them."
            )
        checkpoint = plain(with_trainer_keys(rest))
        checkpoint[WEIGHTS] = user_module(model).state_dict()
        checkpoint[OPTIMIZERS] = [optimizer.state_dict() for _, optimizer in optimizers]
        self.checkpoint_io.save_checkpoint(checkpoint, path, storage_options=storage_options)

    def load_checkpoint(
        self, path: Any, state: Any = None, strict: bool = True, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """A one-card checkpoint of Fabric or the Trainer into the state's model, optimizer and LR schedulers, checked
        first; the rest of it (the Trainer's ``global_step``, ``loops``...) is returned. A ZeRO preset's checkpoint
        (DeepSpeed, FSDP2, FairScale: it has a manifest) resumes its weights alone, with one warning saying why."""
        if not isinstance(state, dict) or not state:
            return super().load_checkpoint(path, state, strict, weights_only)  # Fabric's own raw loads
        where = Path(path)
        check_checkpoint(where, user_module(the_module(state)[1]))
        sharded = checkpoint_manifest(where) is not None

        def load(others: dict[str, Any]) -> dict[str, Any]:
            if sharded:
                checkpoint = weights_only_of_another_backend(where, self.zero_backend, self.zero.stage)
            else:
                checkpoint = self.checkpoint_io.load_checkpoint(where, weights_only=weights_only)
            user_module(the_module(others)[1]).load_state_dict(checkpoint.pop(WEIGHTS), strict=strict)
            if checkpoint.pop(WEIGHTS_ONLY_KEY, False):
                del checkpoint[OPTIMIZERS]  # none: the optimizers start afresh
            else:
                for optimizer, optimizer_state in saved_optimizer_states(checkpoint, optimizers_of(others), strict):
                    optimizer.load_state_dict(optimizer_state)
            return restore_entries(checkpoint, others, strict)

        return load_with_schedulers(state, strict, load)

    def teardown(self) -> None:
        """The replaced optimizers' hooks off the parameters, the memory cap and the allocator's settings given
        back."""
        tear_down_levers(self.zero, self.root_device, self.replaced, self._allocator_before)
        self.replaced.clear()
        self._allocator_before = None
        self._set_up_device = False
        super().teardown()


class OffloadedActivations(nn.Module):
    """The module ``fabric.setup`` hands Fabric under ``activation_offload``: the user's forward (and each method
    marked with ``mark_forward_method``) runs inside :func:`saved_tensors_context`. Checkpoints hold the user's
    module (:func:`user_module`), so their keys are its own."""

    def __init__(self, module: nn.Module, zero: OneCardConfig, device: torch.device) -> None:
        super().__init__()
        self.module = module
        self.zero = zero
        self.on = device

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with saved_tensors_context(self.zero, self.on):
            return self.module(*args, **kwargs)


def user_module(model: nn.Module) -> nn.Module:
    """The user's module of one ``fabric.save``/``fabric.load`` is given (Fabric hands the strategy the module it set
    up)."""
    return model.module if isinstance(model, OffloadedActivations) else model
