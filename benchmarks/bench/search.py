"""Where the largest micro-batch under the cap lies: the next batch to try, and the bracket that trials give.

Pure functions: the worker asks :func:`next_candidate` after each successful stage, the runner reads the
bracket off the trials of every process with :func:`bracket`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence


@dataclasses.dataclass(frozen=True)
class SearchPolicy:
    """How a search proceeds.

    Args:
        start: First micro-batch tried.
        max_batch: Largest micro-batch tried (the result is then "at least this").
        tolerance: Resolution: the search stops once the smallest OOM is within this fraction above the largest fit.
        headroom: Fraction of the predicted maximum to jump to (below it, so that the jump usually fits).
        near_cap: Above this fraction of the cap, the search only probes one ``tolerance`` step up.
        budget_s: Seconds one search process may spend before it stops ascending.
        history: ``(batch, peak reserved bytes)`` of successful stages from earlier processes, oldest first.
    """

    start: int = 1
    max_batch: int = 512
    tolerance: float = 0.06
    headroom: float = 0.97
    near_cap: float = 0.95
    budget_s: float = 180.0
    history: tuple[tuple[int, int], ...] = ()


def next_candidate(history: Sequence[tuple[int, int]], cap_bytes: int, policy: SearchPolicy) -> int | None:
    """The micro-batch to try after the successful stages ``history`` (``None``: stop, the limit is reached).

    Far from the cap the batch doubles; once the last two stages' peaks (memory is close to affine in the batch)
    put the cap within reach, it jumps to ``headroom`` times the predicted maximum, and from there probes one
    ``tolerance`` step up, which normally ends the search with an OOM at the required resolution.
    """
    batch, peak = history[-1]
    if batch >= policy.max_batch:
        return None
    step_up = max(batch + 1, math.ceil(batch * (1 + policy.tolerance)))
    if cap_bytes > 0 and peak >= policy.near_cap * cap_bytes:
        return min(step_up, policy.max_batch)  # peaks are noisy up here: never double next to the cap
    candidate = 2 * batch
    previous = [(b, p) for b, p in history[:-1] if b < batch]
    if cap_bytes > 0 and previous:
        b0, p0 = previous[-1]
        slope = (peak - p0) / (batch - b0)
        if slope > 0:
            predicted = batch + (cap_bytes - peak) / slope
            candidate = min(2 * batch, max(step_up, math.floor(predicted * policy.headroom)))
    return min(candidate, policy.max_batch)


@dataclasses.dataclass(frozen=True)
class Bracket:
    """What the trials say: the largest micro-batch that fitted on every rank, and the smallest that did not."""

    fits: int
    fails: int | None

    def resolved(self, tolerance: float, max_batch: int) -> bool:
        """Whether the search is finished: fine enough, at the limit, or nothing fits at all."""
        if self.fails is None:
            return self.fits >= max_batch
        if self.fits == 0:
            return self.fails == 1
        return self.fails <= max(self.fits + 1, math.ceil(self.fits * (1 + tolerance)))

    def refine_start(self) -> int:
        """Where a follow-up search starts: half way into the open bracket (or 1 when nothing fitted)."""
        if self.fails is None:
            return 2 * self.fits
        return max(1, (self.fits + self.fails) // 2) if self.fits else max(1, self.fails // 4)


def bracket(ok: Iterable[int], failed: Iterable[int]) -> Bracket:
    """The bracket from every trial: ``ok`` batches that fitted on all ranks, ``failed`` ones that did not."""
    fits = max(ok, default=0)
    above = [b for b in failed if b > fits]
    return Bracket(fits, min(above) if above else None)
