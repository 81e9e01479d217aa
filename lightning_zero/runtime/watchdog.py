"""No orphaned ranks: when a rank of a run ends early, the other ranks on its machine end too, within seconds.

A rank that fails (an exception, the OOM killer, ``kill -9``) leaves the others blocked in their next collective,
for the collective timeout (30 minutes by default) or for ever in DeepSpeed's shared-memory collectives; when the
failed rank is Lightning's launching process (rank 0), nothing else reaps them. Each rank runs a
:class:`RankWatchdog` thread from the strategy's ``setup_environment`` to its ``teardown``: it watches the
process ids of the other ranks on the same machine and, when one has gone while the run is still on, prints one
``error:`` line naming that rank and ends this process with exit status 1. Ranks on other machines are left to
the backend's own connection errors and timeouts.
"""

from __future__ import annotations

import atexit
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import torch.distributed as dist

from lightning_zero.errors import ZeroConfigError

#: Exit status of a rank ended because another rank ended first.
EXIT_STATUS = 1


class RankWatchdog:
    """Ends this process when one of ``peers`` (rank -> process id) has ended, unless stopped first.

    Args:
        rank: This process's global rank, for the message.
        peers: The other ranks on this machine and their process ids.
        poll_s: How often to look.
        grace_s: How long a rank may still take to reach ``teardown`` after a peer ended: a peer that finished
            the run's last collective may exit a moment before this rank stops its watchdog.
        report_wait_s: How long a failed rank waits for the rank that ended first (whose process may take
            seconds to exit after closing its connections) to name it.
        stream: Where the one-line message goes.
        exit: Ends the process (``os._exit``: the main thread may be blocked in a collective for ever).
    """

    def __init__(
        self,
        rank: int,
        peers: dict[int, int],
        poll_s: float = 0.5,
        grace_s: float = 2.0,
        report_wait_s: float = 5.0,
        stream: TextIO | None = None,
        exit: Callable[[int], object] = os._exit,
    ) -> None:
        self.rank = rank
        self.peers = dict(peers)
        self.poll_s = poll_s
        self.grace_s = grace_s
        self.report_wait_s = report_wait_s
        self.stream = stream
        self.exit = exit
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="lightning-zero-rank-watchdog", daemon=True)

    def start(self) -> RankWatchdog:
        """Start watching in a daemon thread; returns ``self``."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """The run is over on this rank (finished or failed by itself): stop watching, and wait for the thread to
        end, so no thread of the run outlives it."""
        self._stopped.set()
        if self._thread.ident is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def report_failed_peer(self) -> None:
        """This rank failed (the strategy's ``on_exception``): if another rank ended first, which is what a failed
        collective says, name it; waits up to ``report_wait_s`` for that rank's process to go."""
        self.stop()
        deadline = time.monotonic() + self.report_wait_s
        while (ended := self._ended_peer()) is None and time.monotonic() < deadline:
            time.sleep(self.poll_s / 5)
        if ended is not None:
            self._say_ended(*ended)

    def _watch(self) -> None:
        while not self._stopped.wait(self.poll_s):
            ended = self._ended_peer()
            if ended is not None and not self._stopped.wait(self.grace_s):
                self._say_ended(*ended)
                self.exit(EXIT_STATUS)
                return

    def _ended_peer(self) -> tuple[int, int] | None:
        return next(((rank, pid) for rank, pid in sorted(self.peers.items()) if not is_alive(pid)), None)

    def _say_ended(self, rank: int, pid: int) -> None:
        print(
            f"error: rank {rank} (pid {pid}) ended before the run finished: ending rank {self.rank} too "
            f"(rank {rank}'s own output above says why).",
            file=self.stream or sys.__stderr__ or sys.stderr,
            flush=True,
        )


def is_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, ended but not yet reaped by its parent, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True  # no /proc (macOS): the signal check above is all there is
    return state not in ("Z", "X")


def local_peers(rank: int, hosts_and_pids: list[tuple[str, int]], host: str) -> dict[int, int]:
    """The other ranks on ``host`` and their process ids, from every rank's ``(host, pid)``."""
    return {other: pid for other, (where, pid) in enumerate(hosts_and_pids) if where == host and other != rank}


def start_rank_watchdog() -> RankWatchdog | None:
    """Exchange process ids with the other ranks (one collective) and start watching those on this machine.

    Call on every rank once the default process group exists; ``None`` for a single process.
    """
    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
        return None
    host = socket.gethostname()
    hosts_and_pids: list[tuple[str, int]] = [("", 0)] * dist.get_world_size()
    dist.all_gather_object(hosts_and_pids, (host, os.getpid()))
    rank = dist.get_rank()
    return RankWatchdog(rank, local_peers(rank, hosts_and_pids, host)).start()


def report_failed_peer(watchdog: RankWatchdog | None, exception: BaseException) -> None:
    """Name the rank that ended first, if any, when this rank fails (the strategy's ``on_exception``); bad input
    (a :class:`ZeroConfigError`, which every rank finds by itself) only stops the watchdog."""
    if watchdog is None:
        return
    if isinstance(exception, ZeroConfigError):
        watchdog.stop()
    else:
        watchdog.report_failed_peer()


if TYPE_CHECKING:  # what the mixin is placed before: typed as such, a plain class at run time
    from lightning.pytorch.strategies import Strategy as _Strategy
else:
    _Strategy = object


#: How long, at exit, gloo's worker threads get to free what their last collectives held (see `WatchedRanks`).
GLOO_WORKERS_SETTLE_S = 0.1


def end_process_groups() -> None:
    """Destroy torch's process groups, if any are up, then let gloo's worker threads settle."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    let_gloo_workers_settle()


def let_gloo_workers_settle() -> None:
    """Release the interpreter lock for :data:`GLOO_WORKERS_SETTLE_S`, so that a gloo worker thread still freeing
    the buffers of a collective that just finished (which takes the lock) does so before Python finalises.

    A timed wait, not an event: torch offers no way to wait for those threads while a group's object lives, and
    a run's modules, optimizers and hooks keep their groups alive until the interpreter's shutdown.
    """
    time.sleep(GLOO_WORKERS_SETTLE_S)


class WatchedRanks(_Strategy):
    """Mixin placed before a Lightning strategy class: a :class:`RankWatchdog` from the end of
    ``setup_environment`` (the process group exists then) to ``teardown``, the failed peer named in
    ``on_exception``, and the process groups of a run that finished destroyed when Python exits.

    A gloo worker thread frees the tensors of the collective it ran after the caller has them back, and takes the
    interpreter lock to do so; once Python finalises, a thread that takes it is ended, and ending a C++ thread
    aborts the process ("terminate called without an active exception", exit -6) after a run that succeeded,
    for example right after a ZeRO-3 ``full_state_dict()``. So at exit, after a run that finished, the groups are
    destroyed (a group nothing else holds is freed then, its threads joined) and the worker threads get a moment
    to settle (:func:`let_gloo_workers_settle`). A failed run's groups are left as they are.
    """

    _rank_watchdog: RankWatchdog | None = None
    _run_failed = False

    @staticmethod
    def end_process_groups() -> None:
        """What ends this strategy's process groups at exit (a backend keeping references of its own ends those
        too)."""
        end_process_groups()

    def setup_environment(self) -> None:
        super().setup_environment()
        self._run_failed = False
        self._rank_watchdog = start_rank_watchdog()

    def teardown(self) -> None:
        if self._rank_watchdog is not None:
            self._rank_watchdog.stop()
        super().teardown()
        if not self._run_failed:
            atexit.unregister(self.end_process_groups)  # once, however many runs the process makes
            atexit.register(self.end_process_groups)

    def on_exception(self, exception: BaseException) -> None:
        self._run_failed = True
        atexit.unregister(self.end_process_groups)
        report_failed_peer(self._rank_watchdog, exception)
        super().on_exception(exception)
