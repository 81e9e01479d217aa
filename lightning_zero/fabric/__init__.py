"""lightning-zero under Lightning Fabric: the presets by name in ``Fabric(strategy=...)`` and the strategy classes
behind them, sharing the Trainer strategies' typed configs, translation, preset table and checkpoint format.

``import lightning_zero`` registers every preset with Fabric's strategy registry too
(:func:`lightning_zero.presets.register_fabric_presets`); ``zero_auto`` chooses its layout from the memory plan
there (:mod:`lightning_zero.fabric.auto`), the one-card presets run on one device
(:mod:`lightning_zero.fabric.onecard`).
"""
