"""``zero_auto`` under Lightning Fabric: the DeepSpeed layout chosen at ``fabric.setup`` from the memory plan.

    Fabric(strategy="zero_auto")                                              # budget: the whole GPU
    Fabric(strategy=build_fabric_preset("zero_auto", memory_budget_gib=24, activation_share=0.4))

A Fabric loop has no training step the strategy could probe or time, so ``zero_auto`` chooses as the Trainer's
does before its trials (:mod:`lightning_zero.auto.plan`, :func:`lightning_zero.auto.search.candidates`): the
first DeepSpeed layout in the search's order (no offload first, then stage 2 before 1 and 3) whose model states
and buffers fit each device's budget with ``activation_share`` of it left for the activations, and whose host
memory fits the host. It trains under that layout as the preset of that layout does, and logs the plan and the
choice.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import psutil
from lightning.fabric.utilities import rank_zero_info
from torch.nn import Module
from torch.optim import Optimizer

from lightning_zero.auto.plan import PlanRow, candidate_layouts, format_plan, make_plan
from lightning_zero.auto.search import Candidate, candidates
from lightning_zero.auto.strategy import AutoZeroConfig, candidate_zero, zero_auto_budget_gib
from lightning_zero.errors import ZeroConfigError
from lightning_zero.fabric.deepspeed import FabricZeroStrategy, remote_device
from lightning_zero.memory.allocator import restore_allocator, use_expandable_segments
from lightning_zero.memory.budget import GIB
from lightning_zero.memory.probe import ActivationProbe
from lightning_zero.memory.states import ParameterShapes
from lightning_zero.strategies.deepspeed_settings import DeepSpeedSettings

#: ``zero_auto``'s fields that set up its trials, which Fabric has none of (what the error says instead).
TRIAL_FIELDS = (
    "batch_size",
    "batch_arg_name",
    "max_micro_batch",
    "max_trials",
    "trial_steps",
    "warmup_steps",
    "cache_file",
    "approximate",
)


@dataclasses.dataclass(frozen=True)
class FabricAutoZeroConfig(AutoZeroConfig):
    """``zero_auto``'s settings under Fabric: :class:`~lightning_zero.auto.strategy.AutoZeroConfig`'s without the
    fields of its trials (:data:`TRIAL_FIELDS`, refused), and one of its own.

    Args:
        activation_share: The share of the budget left for activations: a layout is chosen when its model states
            and buffers fit in the rest (Fabric gives no batch to measure them on; ``lightning-zero plan``
            measures them for a config's model and data).
    """

    activation_share: float = 0.25

    def __post_init__(self) -> None:
        super().__post_init__()
        defaults = AutoZeroConfig()
        for name in TRIAL_FIELDS:
            if getattr(self, name) != getattr(defaults, name):
                raise ZeroConfigError(
                    f"`{name}` sets up `zero_auto`'s trials, which run under the Trainer only (under Fabric it chooses"
                    " from the memory plan): remove it, or train with the Trainer."
                )
        if not 0.0 <= self.activation_share < 1.0:
            raise ZeroConfigError(
                f"`activation_share` is the share of the budget left for activations, from 0 up to 1 (not"
                f" included), got {self.activation_share!r}."
            )


def plan_choice(
    shapes: ParameterShapes,
    config: FabricAutoZeroConfig,
    budget_gib: float,
    devices: int,
    nodes: int,
    precision: str,
    on_cuda: bool,
    host_free_bytes: int,
) -> tuple[Candidate, list[PlanRow]]:
    """The layout ``zero_auto`` runs under Fabric (one sample a micro-batch, no accumulation) and the plan it was
    chosen from: the DeepSpeed layouts with ``config``'s activation checkpointing, activations taken as the
    budget's ``activation_share``."""
    reserved = int(config.activation_share * budget_gib * GIB)
    probe = ActivationProbe(0, reserved, 0, reserved, method="reserved share of the budget")
    layouts = [
        layout
        for layout in candidate_layouts()
        if layout.backend == "deepspeed" and layout.activation_checkpointing == config.activation_checkpointing
    ]
    rows = make_plan(shapes, probe, budget_gib, devices, nodes, precision, 1, layouts)
    world = devices * nodes
    found = candidates(rows, world, world, shapes.total, on_cuda, 1, host_free_bytes=host_free_bytes)
    if not found:
        raise ZeroConfigError(
            f"No DeepSpeed layout's model states fit {1 - config.activation_share:.0%} of `memory_budget_gib:"
            f" {budget_gib:g}` on {world} device(s) (`activation_share` keeps the rest for activations): raise the"
            " budget, lower `activation_share`, or add devices."
        )
    return found[0], rows


class FabricZeroAutoStrategy(FabricZeroStrategy):
    """DeepSpeed ZeRO with the stage and offload chosen from the memory plan at ``fabric.setup``
    (:func:`plan_choice`); the choice is in :attr:`chosen`, its plan in :attr:`plan_rows`.

    Args:
        zero: A :class:`FabricAutoZeroConfig` or a mapping of its fields.
        **kwargs: As for :class:`~lightning_zero.fabric.deepspeed.FabricZeroStrategy`.
    """

    strategy_name = "zero_auto"

    def __init__(self, zero: FabricAutoZeroConfig | dict[str, Any] | None = None, **kwargs: Any) -> None:
        self.auto = FabricAutoZeroConfig.coerce(zero)
        super().__init__(zero=self.auto, **kwargs)
        self.chosen: Candidate | None = None
        self.plan_rows: list[PlanRow] = []
        self._allocator_before: str | None = None

    def setup_module_and_optimizers(self, module: Module, optimizers: list[Optimizer], scheduler: Any = None) -> Any:
        """Choose the layout for ``module``, then set up DeepSpeed's engine under it."""
        self.choose(module)
        return super().setup_module_and_optimizers(module, optimizers, scheduler)

    def setup_module(self, module: Module) -> Any:
        self.choose(module)
        return super().setup_module(module)

    def choose(self, module: Module) -> Candidate:
        """The layout for ``module`` (the same on every rank: the plan depends on the model and the world only),
        which the run's settings become; logged with its plan on rank 0."""
        if self.auto.expandable_segments and self._allocator_before is None:
            self._allocator_before = use_expandable_segments(self.root_device, "zero_auto")
        budget = zero_auto_budget_gib(self.auto.memory_budget_gib, self.root_device)
        precision = str(self.precision.precision)
        candidate, rows = plan_choice(
            ParameterShapes.of(module),
            self.auto,
            budget,
            self.num_processes,
            self.num_nodes,
            precision,
            self.root_device.type == "cuda",
            int(self.broadcast(psutil.virtual_memory().available)),
        )
        self.chosen, self.plan_rows = candidate, rows
        base = self.auto.replace(memory_budget_gib=budget)
        resolved = self.settings.trainer  # Fabric's values, filled in at launch (`_format_config`)
        assert resolved is not None, "a layout is chosen once Fabric has launched"
        self.settings = DeepSpeedSettings.from_zero(candidate_zero(base, candidate)).with_trainer(resolved)
        self.remote_device = remote_device(self.zero)
        rank_zero_info(format_plan(rows, budget, 1))
        rank_zero_info(f"zero_auto chose {candidate.layout.name} from the memory plan (Fabric: no trials).")
        return candidate

    def teardown(self) -> None:
        super().teardown()
        if self._allocator_before is not None:
            restore_allocator(self._allocator_before)
            self._allocator_before = None
