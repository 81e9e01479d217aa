"""Run a multi-process script under a hard timeout that kills its whole process group.

When one rank fails, Lightning's launcher can leave the other rank running for ever; a test that waits
on it would hang CI. Every multi-process test goes through :func:`run_script`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from lightning_zero.runtime.watchdog import is_alive

if TYPE_CHECKING:  # pytest is imported where a test runs, not in the ranks
    import pytest

REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")
R = TypeVar("R")


def run_script(script: Path | str, *args: str, timeout: float = 600, cwd: Path | None = None) -> str:
    """Run ``python script args`` in a new process session; return its output, or fail with its tail."""
    command = [sys.executable, str(script), *args]
    process = subprocess.Popen(
        command,
        cwd=cwd or REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        raise AssertionError(f"{' '.join(command)} timed out after {timeout}s:\n{_tail(output)}") from None
    finally:
        _kill_group(process.pid)
    if process.returncode != 0:
        raise AssertionError(f"{' '.join(command)} exited {process.returncode}:\n{_tail(output)}")
    return output


def run_until_every_rank_ended(command: list[str], timeout: float = 240) -> tuple[int, str]:
    """Run a launch whose ranks are meant to end by themselves; its exit status and output, or fail if a rank is
    still there after ``timeout`` (the pipe closes only when the last rank holding it ends)."""
    import pytest

    process = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"a rank was still running after {timeout:g} s:\n{output[-4000:]}")
    return process.returncode, output


def side_by_side(run: Callable[[T], R], arguments: dict[str, T], at_once: int | None = None) -> dict[str, R]:
    """``run`` of each value of ``arguments``, ``at_once`` at a time (all by default), by key. Launches that mostly
    wait (on a peer's death, a watchdog's grace) overlap their waits; one-process runs that mostly import run two at a
    time on two cores."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=at_once or len(arguments)) as pool:
        return dict(zip(arguments, pool.map(run, arguments.values()), strict=True))


def launches_side_by_side(
    tmp_path_factory: pytest.TempPathFactory, commands: dict[str, Callable[[Path], list[str]]]
) -> dict[str, tuple[Path, int, str]]:
    """Each of ``commands``, given a fresh directory of its own, run :func:`side_by_side` until every rank ended: by
    key, its directory, exit status and output."""
    outs = {key: tmp_path_factory.mktemp(key) for key in commands}
    ended = side_by_side(run_until_every_rank_ended, {key: command(outs[key]) for key, command in commands.items()})
    return {key: (outs[key], *ended[key]) for key in commands}


def assert_a_killed_rank_ended_the_run(out: Path, status: int, output: str) -> None:
    """The launch that wrote ``out`` (each rank's ``pid-<rank>``, the killed rank's ``failed-at``) ended, non-zero,
    with one line naming rank 0, and left no rank behind (any left is killed)."""
    pids = [int((out / f"pid-{rank}").read_text()) for rank in (0, 1)]
    try:
        assert (out / "failed-at").exists(), output[-4000:]
        assert not [pid for pid in pids if is_alive(pid)], "a rank outlived the run"
        assert status != 0
        # Counted anywhere, not per line: the other rank's progress bar can share the line.
        assert output.count("error: rank 0 (pid") == 1, output[-4000:]
    finally:
        for pid in pids:
            if is_alive(pid):
                os.kill(pid, signal.SIGKILL)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def _tail(output: str, lines: int = 60) -> str:
    return "\n".join(output.splitlines()[-lines:])
