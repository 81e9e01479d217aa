"""No orphaned ranks: when one rank of a real 2-process run fails, the other ends within 60 s, non-zero, with one
line naming the failed rank, and no process of the run outlives it.

The matrix covers, in one launch each: an exception on rank 1 and ``kill -9`` of rank 0 (Lightning's launching
process, whose children nothing else reaps) on DeepSpeed (whose CPU collectives spin in shared memory), the
launcher's death on FairScale and ``kill -9`` of rank 1 on FSDP2 (both gloo).
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lightning_zero.errors import ZeroConfigError
from lightning_zero.strategies.watchdog import RankWatchdog, is_alive, local_peers, report_failed_peer
from tests.helpers.launch import REPO

SCRIPT = REPO / "tests" / "helpers" / "orphan_run.py"
CASES = [
    ("zero2", 1, "raise"),
    ("zero2", 0, "kill"),
    ("zero2_fairscale", 0, "kill"),
    ("zero3_fsdp", 1, "kill"),
]


def run_until_every_rank_ended(out: Path, strategy: str, rank: int, how: str) -> tuple[int, str, float]:
    """The run's exit status, output and end time; fails if a rank is still there after the hard timeout."""
    command = [sys.executable, str(SCRIPT), str(out), strategy, str(rank), how]
    process = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output, _ = process.communicate(timeout=240)  # the pipe closes when the last rank holding it ends
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"a rank was still running after 240 s:\n{output[-4000:]}")
    return process.returncode, output, time.time()


@pytest.mark.parametrize(("strategy", "rank", "how"), CASES, ids=[f"{s}-{h}-rank{r}" for s, r, h in CASES])
def test_when_a_rank_fails_the_other_ends_too(strategy: str, rank: int, how: str, tmp_path: Path) -> None:
    status, output, ended = run_until_every_rank_ended(tmp_path, strategy, rank, how)
    pids = [int((tmp_path / f"pid-{r}").read_text()) for r in (0, 1)]
    try:
        assert (tmp_path / "failed-at").exists(), output[-4000:]
        assert not [pid for pid in pids if is_alive(pid)], "a rank outlived the run"
        assert status != 0
        assert ended - float((tmp_path / "failed-at").read_text()) < 60
        # Counted anywhere, not per line: the other rank's progress bar can share the line.
        ours = output.count(f"error: rank {rank} (pid")
        # Lightning's launcher in rank 0 polls its children every 5 s and may name a dead child first
        lightnings = output.count(f"[rank: {rank}] Child process with PID")
        assert ours <= 1 and ours + lightnings >= 1, output[-4000:]
    finally:
        for pid in pids:
            if is_alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_watchdog_ends_the_process_when_a_peer_is_gone() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    ended: list[int] = []
    stream = io.StringIO()
    watchdog = RankWatchdog(0, {1: gone.pid}, poll_s=0.05, grace_s=0.1, stream=stream, exit=ended.append).start()
    watchdog._thread.join(timeout=10)
    assert ended == [1]
    assert stream.getvalue().startswith(f"error: rank 1 (pid {gone.pid}) ended before the run finished")


def test_watchdog_stopped_within_the_grace_ends_nothing() -> None:
    peer = subprocess.Popen([sys.executable, "-c", "pass"])
    peer.wait()
    ended: list[int] = []
    watchdog = RankWatchdog(1, {0: peer.pid}, poll_s=0.05, grace_s=5, stream=io.StringIO(), exit=ended.append)
    watchdog.start()
    time.sleep(0.5)
    watchdog.stop()
    watchdog._thread.join(timeout=10)
    assert ended == []


def test_a_live_peer_is_left_alone() -> None:
    ended: list[int] = []
    watchdog = RankWatchdog(1, {0: os.getpid()}, poll_s=0.05, grace_s=0.05, exit=ended.append).start()
    time.sleep(0.5)
    watchdog.stop()
    assert ended == []


def test_zombies_count_as_ended() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while is_alive(child.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not is_alive(child.pid)  # ended, not yet reaped
    child.wait()


def test_only_ranks_on_this_machine_are_watched() -> None:
    everyone = [("a", 10), ("a", 11), ("b", 12), ("a", 13)]
    assert local_peers(1, everyone, "a") == {0: 10, 3: 13}


def test_a_rank_failing_on_bad_input_names_no_peer() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stream = io.StringIO()
    watchdog = RankWatchdog(0, {1: gone.pid}, poll_s=60, report_wait_s=5, stream=stream)
    report_failed_peer(watchdog, ZeroConfigError("bad stage"))
    assert stream.getvalue() == ""
    report_failed_peer(watchdog, RuntimeError("Connection closed by peer"))
    assert stream.getvalue().startswith(f"error: rank 1 (pid {gone.pid}) ended before the run finished")
