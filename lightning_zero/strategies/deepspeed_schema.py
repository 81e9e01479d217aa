"""A DeepSpeed config checked by DeepSpeed's own parser in the launching process, before any rank starts.

DeepSpeed ignores a top-level key it never reads (a config with ``zero_optimisation`` trains without ZeRO, silently)
and refuses a bad key or value inside a section with a pydantic traceback from every rank, after launch. Here each
top-level section goes through DeepSpeed's own config parser on its own: a section the parser never asks for is
unknown, and its pydantic models' refusals are reported for that section. Either ends as one line naming the key
and the closest valid name.
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import KeysView, Mapping
from pathlib import Path
from typing import Any

import pydantic

from lightning_zero.errors import ZeroConfigError
from lightning_zero.internals import deepspeed_section_parser

#: DeepSpeed's config reference, for names nothing close to which exists.
CONFIG_REFERENCE = "https://www.deepspeed.ai/docs/config-json/"

#: Top-level keys that ``deepspeed.initialize`` reads itself, outside the config parser this module runs.
READ_BY_INITIALIZE = frozenset({"sequence_parallel_size", "data_parallel_size"})


class _ReadKeys(KeysView[str]):
    """``keys()`` of a :class:`_RecordingDict`: membership tests are reads too."""

    def __init__(self, owner: _RecordingDict) -> None:
        super().__init__(owner)
        self._owner = owner

    def __contains__(self, key: object) -> bool:
        self._owner.read.add(key)
        return dict.__contains__(self._owner, key)


class _RecordingDict(dict[str, Any]):
    """A config whose top-level keys remember being asked for; ``read`` survives ``copy.copy``, which DeepSpeed
    makes of the config before parsing it."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        self.read: set[object] = set()

    def __contains__(self, key: object) -> bool:
        self.read.add(key)
        return super().__contains__(key)

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def keys(self) -> _ReadKeys:  # type: ignore[override]
        return _ReadKeys(self)


def check_deepspeed_config(ds_config: Mapping[str, Any], source: str | Path | Mapping[str, Any] | None = None) -> None:
    """Raise :class:`ZeroConfigError` on the first section or key of ``ds_config`` that DeepSpeed would ignore or
    refuse, naming the closest valid name; ``source``: the file it was read from, for the message.

    ``"auto"`` values pass: DeepSpeed's config models skip them, and the strategy fills them from the Trainer.
    """
    name = (
        "DeepSpeed config"
        if source is None or isinstance(source, Mapping)
        else f"DeepSpeed config file {str(source)!r}"
    )
    known = set(READ_BY_INITIALIZE)
    for section, value in ds_config.items():
        known |= _parse_section(section, value, name)
    for section in ds_config:
        if section not in known:
            raise ZeroConfigError(
                f"{name}: unknown section `{section}`, which DeepSpeed would silently ignore:"
                f" {_did_you_mean(section, known)}"
            )


def _parse_section(section: str, value: Any, name: str) -> set[str]:
    """Run DeepSpeed's config parser on ``{section: value}``; the top-level names it asked for."""
    from deepspeed.runtime.config import DeepSpeedConfigError

    config = _RecordingDict({section: value})
    try:
        deepspeed_section_parser()(config)
    except pydantic.ValidationError as error:
        raise ZeroConfigError(f"{name}: {_pydantic_reason(section, error)}") from None
    except (DeepSpeedConfigError, AssertionError, TypeError, ValueError, KeyError) as error:
        reason = " ".join(str(error).split()) or type(error).__name__
        raise ZeroConfigError(f"{name}: DeepSpeed refuses section `{section}`: {reason}") from None
    return {key for key in config.read if isinstance(key, str)}


def _pydantic_reason(section: str, error: pydantic.ValidationError) -> str:
    """One line for the first error of a DeepSpeed config model built from ``section``."""
    first = error.errors(include_url=False)[0]
    location = tuple(str(part) for part in first["loc"])
    # A model built from several top-level sections (the monitors) reports the section itself first.
    path = location if location[:1] == (section,) else (section, *location)
    dotted = ".".join(path)
    if first["type"] == "extra_forbidden":
        names = _field_names(_model_named(error.title), location[:-1])
        return f"unknown key `{dotted}`: {_did_you_mean(location[-1], names)}"
    reason = first["msg"].rstrip(".")
    if not location:  # a check across the section's keys: the input is the whole section
        return f"DeepSpeed refuses section `{section}`: {reason}."
    return f"bad value {first['input']!r} for `{dotted}`: {reason}."


def _model_named(title: str) -> type[pydantic.BaseModel] | None:
    """DeepSpeed's config model class called ``title`` (a pydantic error names the model it validated)."""
    from deepspeed.runtime.config_utils import DeepSpeedConfigModel

    pending: list[type[pydantic.BaseModel]] = [DeepSpeedConfigModel]
    while pending:
        model = pending.pop()
        if model.__name__ == title:
            return model
        pending.extend(model.__subclasses__())
    return None


def _field_names(model: type[pydantic.BaseModel] | None, path: tuple[str, ...]) -> set[str]:
    """The keys the nested model at ``path`` below ``model`` accepts: field names and their aliases."""
    for part in path:
        if model is None:
            return set()
        field = next((f for name, f in model.model_fields.items() if part in (name, f.alias)), None)
        model = _model_in(field.annotation) if field is not None else None
    if model is None:
        return set()
    return {name for name, field in model.model_fields.items()} | {
        field.alias for field in model.model_fields.values() if field.alias
    }


def _model_in(annotation: Any) -> type[pydantic.BaseModel] | None:
    """The pydantic model in a field's annotation (``Optional[Model]``, ``Model``), if any."""
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return annotation
    return next((model for arg in typing.get_args(annotation) if (model := _model_in(arg))), None)


def _did_you_mean(name: str, candidates: set[str]) -> str:
    close = difflib.get_close_matches(name, sorted(candidates), n=1)
    if close:
        return f"did you mean `{close[0]}`?"
    return f"remove it, or check its spelling against {CONFIG_REFERENCE}."
