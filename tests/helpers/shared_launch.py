"""One launch of a runner for every test module of the session that wants its runs (see tests/conftest.py).

A module names the runs it asserts on in a module-level list (``BACKEND_RUNS``, ``PARITY_RUNS`` ...); the session
fixture starts the runner once with the union of the lists of the modules that were collected and not skipped, so
a module run alone launches only its own runs and the whole suite pays one start-up per runner, not one per module.
Each runner announces a run on rank 0 with :data:`MARKER` (through Lightning's rank-zero logger, the stream the
strategies' notices go to), so a module reads the output of its own runs only, as if it had launched them itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the runners import this module in their ranks, which need no pytest
    import pytest

#: Training steps of every run of a shared launch.
STEPS = 12
#: Rank 0 logs ``MARKER + run`` as a run starts.
MARKER = "shared launch, run: "


def announce(run: str) -> None:
    """Called by a runner as ``run`` starts (rank 0 logs it; other ranks stay silent)."""
    from lightning.fabric.utilities.rank_zero import rank_zero_info

    rank_zero_info(f"{MARKER}{run}")


@dataclass(frozen=True)
class SharedLaunch:
    """Where the runs wrote their results, and the output of the launch before any run and during each."""

    out: Path
    preamble: str
    segments: dict[str, str]

    @classmethod
    def of(cls, out: Path, outputs: list[str]) -> SharedLaunch:
        """From the outputs of the launches, in order, that wrote into ``out``."""
        preambles, segments = zip(*map(split_output, outputs), strict=True)
        return cls(out, "".join(preambles), {run: text for part in segments for run, text in part.items()})

    def log(self, runs: list[str]) -> str:
        """The output the launch gave before its first run and during ``runs``."""
        return "".join([self.preamble, *(self.segments[run] for run in runs)])


def split_output(output: str) -> tuple[str, dict[str, str]]:
    """``(text before the first marker, {run: text from its marker to the next})`` of a launch's output."""
    preamble: list[str] = []
    segments: dict[str, list[str]] = {}
    current = preamble
    for line in output.splitlines(keepends=True):
        if line.startswith(MARKER):
            current = segments.setdefault(line.removeprefix(MARKER).rstrip("\n"), [])
        else:
            current.append(line)
    return "".join(preamble), {run: "".join(lines) for run, lines in segments.items()}


def wanted_runs(session: pytest.Session, fixture: str, attribute: str) -> list[str]:
    """The union, in collection order, of ``attribute`` of the modules whose collected tests use ``fixture``
    and are not skipped by a ``skipif`` mark (e.g. FairScale not installed)."""
    import pytest

    runs: dict[str, None] = {}
    for item in session.items:
        if not isinstance(item, pytest.Function) or fixture not in item.fixturenames or _skipped(item):
            continue
        runs.update(dict.fromkeys(getattr(item.module, attribute, ())))
    return list(runs)


def _skipped(item: pytest.Item) -> bool:
    return any(mark.args and mark.args[0] is True for mark in item.iter_markers("skipif"))
