"""The application's import paths from before it moved under ``lightning_zero.app`` still work for one release: the
same module objects (never a second copy of a class), with a warning naming the new path."""

from __future__ import annotations

import importlib
import sys

import pytest

from lightning_zero import moved


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("lightning_zero.tasks.causal_lm", "lightning_zero.app.tasks.causal_lm"),
        ("lightning_zero.data.text_corpus", "lightning_zero.app.data.text_corpus"),
        ("lightning_zero.models.blocks", "lightning_zero.runtime.blocks"),
        ("lightning_zero.models.shapes", "lightning_zero.app.models.shapes"),
        ("lightning_zero.checkpoint.consolidate", "lightning_zero.app.consolidate"),
        ("lightning_zero.cli", "lightning_zero.app.cli"),
    ],
)
def test_an_old_path_gives_the_module_at_its_new_path_with_a_warning(old: str, new: str) -> None:
    for name in [name for name in sys.modules if name == old or name.startswith(old + ".")]:
        del sys.modules[name]
    with pytest.warns(FutureWarning, match=f"`{old}` moved to `{new}`"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)


def test_an_old_class_path_is_the_same_class() -> None:
    with pytest.warns(FutureWarning):
        from lightning_zero.tasks.classification import SequenceClassificationTask as Old
    from lightning_zero.app.tasks.classification import SequenceClassificationTask

    assert Old is SequenceClassificationTask


def test_only_moved_names_are_answered() -> None:
    assert moved.new_name("lightning_zero.strategies.deepspeed") is None
    assert moved.new_name("lightning_zero.database") is None
    assert moved.new_name("lightning_zero.app.tasks") is None
