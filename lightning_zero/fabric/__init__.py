"""lightning-zero under Lightning Fabric: the presets by name in ``Fabric(strategy=...)`` and the strategy classes
behind them, sharing the Trainer strategies' typed configs, translation, preset table and checkpoint format.

``import lightning_zero`` registers every preset with Fabric's strategy registry too
(:func:`lightning_zero.presets.register_fabric_presets`). ``zero_auto`` chooses from the memory plan under Fabric
(:mod:`lightning_zero.fabric.auto`); the one-card presets are refused with a one-line error naming the preset to use
instead (docs/fabric.md says why).
"""

from __future__ import annotations

from lightning_zero.errors import ZeroConfigError

#: The Fabric preset that stands in for each backend without a Fabric strategy, and why it has none.
INSTEAD = {
    "onecard": (
        "The one-card presets have no Fabric strategy (their optimizer levers hook into the Trainer's optimizer"
        " set-up): run them under the Trainer, or pass `zero2_offload` to Fabric."
    ),
}


def unsupported_backend(backend: str) -> ZeroConfigError:
    """The one-line error for a preset of ``backend`` under Fabric."""
    return ZeroConfigError(INSTEAD.get(backend, f"Unknown backend {backend!r} under Fabric."))


__all__ = ["INSTEAD", "unsupported_backend"]
