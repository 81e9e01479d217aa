"""No orphaned ranks: when one rank of a real 2-process run fails, the other ends, non-zero, with one line naming
the failed rank, and no process of the run outlives it.

The matrix kills rank 0 with ``kill -9`` (as the OOM killer would), one launch per backend: rank 0 is Lightning's
launching process, whose observer of the other ranks dies with it, so only our watchdog can end rank 1, which
otherwise waits in its next collective for ever (DeepSpeed's CPU collectives spin in shared memory) or for the
30-minute gloo timeout: without the watchdog each case fails at the hard timeout. When another rank fails,
Lightning's observer in rank 0 ends the run by itself, so those cases would not test our code.

A run that finished ends its process groups at exit, before Python finalises (where a gloo worker thread that
still frees a collective's buffers aborts the process); a failed one leaves them.
"""

from __future__ import annotations

import functools
import io
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lightning_zero.errors import ZeroConfigError
from lightning_zero.runtime import watchdog as watchdog_module
from lightning_zero.runtime.watchdog import RankWatchdog, WatchedRanks, is_alive, local_peers, report_failed_peer
from tests.helpers import launch
from tests.helpers.launch import REPO

SCRIPT = REPO / "tests" / "helpers" / "orphan_run.py"
EXIT_SCRIPT = REPO / "tests" / "helpers" / "exit_run.py"
STRATEGIES = ["zero2", "zero2_fairscale", "zero3_fsdp"]


def killing_rank_0(strategy: str, out: Path) -> list[str]:
    return [sys.executable, str(SCRIPT), str(out), strategy, "0", "kill"]


def finishing(out: Path) -> list[str]:
    return [sys.executable, str(EXIT_SCRIPT), str(out)]


@pytest.fixture(scope="module")
def launches(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, int, str]]:
    """Side by side: one launch per strategy in which rank 0 kills itself (keyed by strategy), and one that finishes
    (``finished``); each one's directory, exit status and output."""
    commands: dict[str, Callable[[Path], list[str]]] = {s: functools.partial(killing_rank_0, s) for s in STRATEGIES}
    commands["finished"] = finishing
    return launch.launches_side_by_side(tmp_path_factory, commands)


@pytest.mark.multiprocess
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_when_rank_0_is_killed_the_other_ends_too(launches: dict[str, tuple[Path, int, str]], strategy: str) -> None:
    launch.assert_a_killed_rank_ended_the_run(*launches[strategy])


@pytest.mark.multiprocess
def test_watchdog_ends_the_process_when_a_peer_is_gone() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    ended: list[int] = []
    stream = io.StringIO()
    watchdog = RankWatchdog(0, {1: gone.pid}, poll_s=0.05, grace_s=0.1, stream=stream, exit=ended.append).start()
    watchdog._thread.join(timeout=10)
    assert ended == [1]
    assert stream.getvalue().startswith(f"error: rank 1 (pid {gone.pid}) ended before the run finished")


class CountedWatchdog(RankWatchdog):
    """A watchdog that signals each look at its peers, so a test awaits looks instead of sleeping."""

    def __init__(self, *args: Any, looks: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.looks_left = looks
        self.looked = threading.Event()

    def _ended_peer(self) -> tuple[int, int] | None:
        ended = super()._ended_peer()
        self.looks_left -= 1
        if self.looks_left <= 0:
            self.looked.set()
        return ended


@pytest.mark.multiprocess
def test_watchdog_stopped_within_the_grace_ends_nothing() -> None:
    peer = subprocess.Popen([sys.executable, "-c", "pass"])
    peer.wait()
    ended: list[int] = []
    watchdog = CountedWatchdog(1, {0: peer.pid}, looks=1, poll_s=0.01, grace_s=60, exit=ended.append)
    watchdog.start()
    assert watchdog.looked.wait(timeout=60)  # it saw the ended peer and is within its grace
    watchdog.stop()
    assert ended == []


def test_a_live_peer_is_left_alone() -> None:
    ended: list[int] = []
    watchdog = CountedWatchdog(1, {0: os.getpid()}, looks=5, poll_s=0.01, grace_s=0.01, exit=ended.append)
    watchdog.start()
    assert watchdog.looked.wait(timeout=60)
    watchdog.stop()
    assert ended == []


def test_stop_ends_the_watchdog_thread() -> None:
    watchdog = RankWatchdog(1, {0: os.getpid()}, poll_s=60).start()
    watchdog.stop()
    assert not watchdog._thread.is_alive()  # Lightning's tests fail on a thread left behind


@pytest.mark.multiprocess
def test_zombies_count_as_ended() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # ended, not yet reaped
    assert not is_alive(child.pid)
    child.wait()


def test_only_ranks_on_this_machine_are_watched() -> None:
    everyone = [("a", 10), ("a", 11), ("b", 12), ("a", 13)]
    assert local_peers(1, everyone, "a") == {0: 10, 3: 13}


@pytest.mark.multiprocess
def test_a_rank_failing_on_bad_input_names_no_peer() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stream = io.StringIO()
    watchdog = RankWatchdog(0, {1: gone.pid}, poll_s=60, report_wait_s=5, stream=stream)
    report_failed_peer(watchdog, ZeroConfigError("bad stage"))
    assert stream.getvalue() == ""
    report_failed_peer(watchdog, RuntimeError("Connection closed by peer"))
    assert stream.getvalue().startswith(f"error: rank 1 (pid {gone.pid}) ended before the run finished")


class _StrategyStub:
    def setup_environment(self) -> None:
        pass

    def teardown(self) -> None:
        pass

    def on_exception(self, exception: BaseException) -> None:
        pass


class _Watched(WatchedRanks, _StrategyStub):
    """The mixin before a strategy that does nothing, in one process (so no watchdog starts)."""


class _ExitHooks:
    """Stands in for ``atexit``: the hooks registered, in order."""

    def __init__(self) -> None:
        self.hooks: list[Any] = []

    def register(self, hook: Any) -> None:
        self.hooks.append(hook)

    def unregister(self, hook: Any) -> None:
        self.hooks = [each for each in self.hooks if each != hook]


def test_a_finished_run_ends_its_process_groups_once_at_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    exit_hooks = _ExitHooks()
    monkeypatch.setattr(watchdog_module, "atexit", exit_hooks)
    strategy = _Watched()  # type: ignore[abstract]
    for _ in range(2):  # two runs in one process: one hook
        strategy.setup_environment()
        strategy.teardown()
    assert exit_hooks.hooks == [WatchedRanks.end_process_groups]


def test_a_failed_run_leaves_its_process_groups_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    exit_hooks = _ExitHooks()
    monkeypatch.setattr(watchdog_module, "atexit", exit_hooks)
    strategy = _Watched()  # type: ignore[abstract]
    strategy.setup_environment()
    strategy.teardown()  # a first run finished
    strategy.setup_environment()
    strategy.on_exception(RuntimeError("a collective failed"))
    strategy.teardown()
    assert exit_hooks.hooks == []  # its peers may never join a collective that ending the groups would wait for


@pytest.mark.multiprocess
def test_a_finished_deepspeed_run_has_ended_its_process_groups_before_python_finalises(
    launches: dict[str, tuple[Path, int, str]],
) -> None:
    out, status, output = launches["finished"]
    assert status == 0, output[-6000:]
    for rank in (0, 1):
        left = json.loads((out / f"exit-rank{rank}.json").read_text())
        assert left == {"torch_group_up": False, "deepspeed_group_held": False}
