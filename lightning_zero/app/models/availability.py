"""Whether a model or tokenizer name can be loaded, asked once in the launching process before any rank starts.

Without this, a misspelt hub name is found only inside every rank's ``configure_model``, after transformers has
retried the hub for half a minute, as an ``OSError`` traceback.
"""

from __future__ import annotations

from pathlib import Path

from lightning_zero.app.models.shapes import is_shape, shape_config
from lightning_zero.app.models.source import resolve_pretrained
from lightning_zero.errors import ZeroConfigError

#: Name prefixes that lightning-zero builds itself (a random-init shape, a BPE trained on shipped text).
_BUILT_HERE = ("bpe:",)


def check_loadable(name: str, what: str = "model") -> None:
    """Raise :class:`ZeroConfigError` unless ``name`` is a shape, a local folder, a shipped or cached model, or on
    the Hugging Face hub (asked with one short request)."""
    if name.startswith(_BUILT_HERE):
        return
    if is_shape(name):
        shape_config(name)
        return
    source = resolve_pretrained(name)
    if Path(source).is_dir() or _in_hub_cache(source):
        return
    _check_on_hub(source, what)


def _in_hub_cache(name: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    for filename in ("config.json", "tokenizer_config.json"):
        try:
            if isinstance(try_to_load_from_cache(name, filename), str):
                return True
        except ValueError:  # not a valid repository id
            return False
    return False


def _check_on_hub(name: str, what: str) -> None:
    from huggingface_hub import model_info
    from huggingface_hub.errors import HFValidationError, RepositoryNotFoundError

    try:
        model_info(name, timeout=10)
    except (RepositoryNotFoundError, HFValidationError):
        raise ZeroConfigError(
            f"{what.capitalize()} {name!r} is not on the Hugging Face hub, nor a local folder or a shipped model: "
            "check the name (e.g. sentence-transformers/all-MiniLM-L6-v2), or use `shape:NAME` for a random init."
        ) from None
    except Exception:  # no network: the hub cannot say, so neither can we
        raise ZeroConfigError(
            f"{what.capitalize()} {name!r} is not a local folder, a shipped model or in the Hugging Face cache, and "
            "the hub cannot be reached: check the name, download it on a machine with network access, or point it "
            "at a saved model folder."
        ) from None
