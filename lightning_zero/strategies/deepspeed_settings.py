"""One DeepSpeed set-up, from a preset name or a config file to the running engine, as one frozen value.

:class:`DeepSpeedSettings` holds the two forms a run is described in, which must never disagree: lightning-zero's
typed config (what the strategy itself reads: placement, CPU Adam, the memory budget) and the DeepSpeed config
dict the engine runs. Each form is made from the other once, when the settings are built; the engine's dict is
resolved in one step (:func:`resolve`) from the config as given and what is known of the run so far, never by
editing an earlier result.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

from lightning_zero.errors import ZeroConfigError
from lightning_zero.strategies.deepspeed_config import (
    DeepSpeedZeroConfig,
    TrainerValues,
    has_module_autos,
    load_deepspeed_config,
    resolve_auto,
    resolve_module_autos,
    to_deepspeed_config,
    zero_config_of,
)
from lightning_zero.strategies.deepspeed_schema import check_deepspeed_config


class ReadOnlyConfig(dict[str, Any]):
    """A DeepSpeed config to read, nested sections included: a change is a one-line error naming the fix, since the
    run would never see it (setting a value it already has is no change). A ``dict`` because Lightning's DeepSpeed
    code checks that its config is one; copies (``copy``, ``deepcopy``, pickling) are plain dicts."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__({key: _read_only(value) for key, value in config.items()})

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise config_change_error()

    __delitem__ = pop = popitem = clear = _refuse

    def __setitem__(self, key: str, value: Any) -> None:
        if key not in self or self[key] != value:
            self._refuse()

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def __ior__(self, other: Any) -> ReadOnlyConfig:  # type: ignore[override,misc]
        self.update(other)
        return self

    def setdefault(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self else self._refuse()

    def thawed(self) -> dict[str, Any]:
        """A plain, changeable deep copy."""
        return {
            key: value.thawed() if isinstance(value, ReadOnlyConfig) else copy.deepcopy(value)
            for key, value in self.items()
        }

    def __copy__(self) -> dict[str, Any]:  # DeepSpeed copies a config before changing it: give it one to change
        return self.thawed()

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        return self.thawed()

    def __reduce__(self) -> tuple[type, tuple[dict[str, Any]]]:
        return dict, (self.thawed(),)


def config_change_error() -> ZeroConfigError:
    """The error for a change to a built strategy's DeepSpeed config."""
    return ZeroConfigError(
        "A lightning-zero strategy's DeepSpeed config cannot be changed once built: give the change when building"
        " it (`deepspeed_config=` or the `zero=` fields)."
    )


def _read_only(value: Any) -> Any:
    return ReadOnlyConfig(value) if isinstance(value, Mapping) else value


@dataclasses.dataclass(frozen=True)
class OptimizerValues:
    """What the module's optimizer and the run's length decide, known once the model exists.

    Args:
        hparams: The optimizer's ``defaults`` (lr, weight_decay, betas, eps).
        total_steps: The run's optimizer steps.
    """

    hparams: Mapping[str, Any]
    total_steps: int


def resolve(
    given: Mapping[str, Any], trainer: TrainerValues | None, optimizer: OptimizerValues | None
) -> dict[str, Any]:
    """The DeepSpeed config an engine runs: ``given`` with its ``"auto"`` values filled from the Trainer's values
    and, once known, the module optimizer's (``given`` as it is while the Trainer's are unknown)."""
    if trainer is None:
        return copy.deepcopy(dict(given))
    resolved = resolve_auto(given, trainer)
    return resolved if optimizer is None else resolve_module_autos(resolved, optimizer.hparams, optimizer.total_steps)


@dataclasses.dataclass(frozen=True)
class DeepSpeedSettings:
    """Our typed config and the DeepSpeed config of one run, which cannot disagree.

    Build it with :meth:`from_zero` or :meth:`from_deepspeed`; :meth:`with_trainer` and :meth:`with_optimizer` give
    copies that know more of the run. :meth:`deepspeed_dict` is the engine's config, resolved from ``given`` and
    every value known (a one-line error when they contradict each other).

    Args:
        zero: The typed config.
        given: The DeepSpeed config as given (a preset's translation or a user's file), ``"auto"`` values unfilled.
        trainer: The Trainer's values, once the Trainer is known.
        optimizer: The module optimizer's values, once the model exists.
    """

    zero: DeepSpeedZeroConfig
    given: Mapping[str, Any]
    trainer: TrainerValues | None = None
    optimizer: OptimizerValues | None = None
    _resolved: ReadOnlyConfig = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "given", ReadOnlyConfig(copy.deepcopy(dict(self.given))))  # its own, unchangeable
        object.__setattr__(self, "_resolved", ReadOnlyConfig(resolve(self.given, self.trainer, self.optimizer)))

    @classmethod
    def from_zero(cls, zero: DeepSpeedZeroConfig) -> DeepSpeedSettings:
        """The settings of a typed config (a preset's fields): its DeepSpeed config is its translation."""
        return cls(zero, to_deepspeed_config(zero))

    @classmethod
    def from_deepspeed(cls, source: str | Path | Mapping[str, Any]) -> DeepSpeedSettings:
        """The settings of a full DeepSpeed config (a dict or a JSON/YAML file), checked by DeepSpeed's own parser;
        the typed config is what it says in our terms (:func:`~lightning_zero.strategies.deepspeed_config.
        zero_config_of`)."""
        ds_config = load_deepspeed_config(source)
        check_deepspeed_config(ds_config, source)
        return cls(zero_config_of(ds_config), ds_config)

    def with_trainer(self, trainer: TrainerValues) -> DeepSpeedSettings:
        """These settings resolved with the Trainer's values (any earlier ones and the optimizer's replaced)."""
        return DeepSpeedSettings(self.zero, self.given, trainer)

    def with_optimizer(self, optimizer: OptimizerValues) -> DeepSpeedSettings:
        """These settings, resolved with the Trainer's values already, also resolved with the module optimizer's."""
        if self.trainer is None:
            raise ValueError("The optimizer's values fill a config the Trainer's values have filled first.")
        return dataclasses.replace(self, optimizer=optimizer)

    @property
    def needs_optimizer(self) -> bool:
        """Whether the config's ``optimizer`` or ``scheduler`` section has ``"auto"`` values still unfilled."""
        return has_module_autos(self._resolved)

    def deepspeed_dict(self) -> dict[str, Any]:
        """The DeepSpeed config, as a new dict that the caller (DeepSpeed) may change freely."""
        return self._resolved.thawed()

    def read_only(self) -> ReadOnlyConfig:
        """The DeepSpeed config, to read (:class:`ReadOnlyConfig`): the same object on every call."""
        return self._resolved
