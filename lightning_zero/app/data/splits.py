"""The one train/validation split of every data module: a seeded shuffle, the same on every rank and every run."""

from __future__ import annotations

import random

from lightning_zero.errors import ZeroConfigError


def seeded_split(count: int, val_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Train and validation indices of ``count`` items, in shuffled order; at least one validation item."""
    if not 0.0 < val_fraction < 1.0:
        raise ZeroConfigError(f"val_fraction must be between 0 and 1, got {val_fraction}: use e.g. 0.1.")
    order = list(range(count))
    random.Random(seed).shuffle(order)
    n_val = max(1, round(count * val_fraction))
    return order[n_val:], order[:n_val]
