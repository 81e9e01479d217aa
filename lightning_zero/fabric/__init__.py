"""lightning-zero under Lightning Fabric: the presets by name in ``Fabric(strategy=...)`` and the strategy classes
behind them, sharing the Trainer strategies' typed configs, translation, preset table and checkpoint format.

``import lightning_zero`` registers every preset with Fabric's strategy registry too
(:func:`lightning_zero.presets.register_fabric_presets`). ``zero_auto`` is refused under
Fabric with a one-line error naming the preset to use instead (docs/fabric.md says why).
"""

from __future__ import annotations

from lightning_zero.errors import ZeroConfigError

#: The Fabric preset that stands in for each backend without a Fabric strategy, and why it has none.
INSTEAD = {
    "auto": (
        "`zero_auto` does not run under Fabric (its search times trial steps through the Trainer's loop): run"
        " `lightning-zero plan` or `zero_auto` once under the Trainer, then pass the preset it chose, e.g."
        " `zero2_offload`."
    ),
}


def unsupported_backend(backend: str) -> ZeroConfigError:
    """The one-line error for a preset of ``backend`` under Fabric."""
    return ZeroConfigError(INSTEAD.get(backend, f"Unknown backend {backend!r} under Fabric."))


__all__ = ["INSTEAD", "unsupported_backend"]
