"""``zero_auto``: the strategy that measures a few layouts and trains with the fastest that fits
(:mod:`~lightning_zero.auto.strategy`), and the pure functions of its search (:mod:`~lightning_zero.auto.search`)."""
