"""Compile DeepSpeed's CPU ops ahead of the first run (``lightning-zero build-ops``), and load them without a hang.

Each op builds in a process of its own under a time limit. torch's extension builder waits without end on a
``lock`` file that a killed earlier build leaves behind, even for an op that is built already: a lock older than
the limit is removed first (no build of ours holds one that long), and the limit turns any other wait into an
error that says which file to delete. A run that loads an op waits for such a lock itself, saying so, until
the build holding it ends or the lock is as old as the limit (:func:`wait_for_build_lock`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightning_zero.internals import extension_build_directory
from lightning_zero.quiet import quiet_libraries

#: DeepSpeed's op builders that CPU runs use: shared-memory collectives, CPU Adam, NVMe async I/O (only where
#: libaio is installed).
CPU_OPS = ("ShareMemCommBuilder", "CPUAdamBuilder", "AsyncIOBuilder")
_NEEDS = {"AsyncIOBuilder": "; it needs libaio-dev, and only NVMe offload uses it"}
#: Seconds one op may take to build; a build lock older than this was left by a killed build.
BUILD_LIMIT_S = 900.0


def build_op(builder: str) -> None:
    """Build one op in this process, or say why it is skipped."""
    with quiet_libraries():
        from deepspeed.accelerator import get_accelerator

        op_builder = get_accelerator().create_op_builder(builder)
    if op_builder is None or not op_builder.is_compatible(verbose=False):
        print(f"skipped {builder}: DeepSpeed cannot build it here{_NEEDS.get(builder, '')}", flush=True)
        return
    lock = build_lock(op_builder.name)
    if remove_stale_lock(lock, BUILD_LIMIT_S):
        print(_removed(lock, BUILD_LIMIT_S), flush=True)
    start = time.monotonic()
    op_builder.load(verbose=False)
    print(f"built {builder} in {time.monotonic() - start:.0f} s", flush=True)


def build_lock(op_name: str) -> Path:
    """The lock file torch's extension builder holds while it builds (or loads) the op ``op_name``."""
    return extension_build_directory(op_name) / "lock"


#: Seconds a build lock may be held before a run loading the op says that it waits on it.
LOCK_NOTICE_S = 60.0


def wait_for_op(builder: str) -> None:
    """Before DeepSpeed loads the op of ``builder`` (e.g. ``"CPUAdamBuilder"``): :func:`wait_for_build_lock`,
    unless the op was installed prebuilt (then no build lock is taken)."""
    with quiet_libraries():
        from deepspeed.accelerator import get_accelerator
        from deepspeed.git_version_info import installed_ops

        op_builder = get_accelerator().create_op_builder(builder)
    if op_builder is not None and not installed_ops.get(op_builder.name, False):
        wait_for_build_lock(op_builder.name)


def wait_for_build_lock(op_name: str, limit_s: float = BUILD_LIMIT_S, poll_s: float = 1.0) -> None:
    """Return once no build holds the op ``op_name``'s lock, removing it once it is ``limit_s`` old.

    torch's builder would wait on a killed build's lock for ever. A build of another process (another rank on
    this host) holds it a minute or two; past :data:`LOCK_NOTICE_S` this says which file it waits on.
    """
    lock = build_lock(op_name)
    noticed = False
    while lock.exists():
        if remove_stale_lock(lock, limit_s):
            print(_removed(lock, limit_s), file=sys.stderr, flush=True)
            return
        if not noticed and _age_s(lock) >= LOCK_NOTICE_S:
            noticed = True
            print(
                f"waiting for {lock}: another process is building DeepSpeed's {op_name}; a build killed midway"
                f" leaves this file, removed here once it is {limit_s:.0f} s old (delete it now if no build runs)",
                file=sys.stderr,
                flush=True,
            )
        time.sleep(poll_s)


def _removed(lock: Path, limit_s: float) -> str:
    return f"removed {lock}: a build killed over {limit_s:.0f} s ago left it"


def _age_s(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def remove_stale_lock(lock: Path, older_than_s: float) -> bool:
    """Delete ``lock`` if it was last touched more than ``older_than_s`` ago; whether it was."""
    stale = _age_s(lock) > older_than_s  # a missing lock is 0 s old
    if stale:
        lock.unlink(missing_ok=True)
    return stale


def build_cpu_ops(builders: Sequence[str] = CPU_OPS, timeout_s: float = BUILD_LIMIT_S) -> list[str]:
    """Build each of ``builders``, each in a child process given ``timeout_s``; return one line per op that did
    not build."""
    return [failure for builder in builders if (failure := _build_in_child(builder, timeout_s))]


def start_build(builder: str, **popen: Any) -> subprocess.Popen[bytes]:
    """Start :func:`build_op` of ``builder`` in a child process, in a session of its own (``popen``: more
    ``subprocess.Popen`` arguments, e.g. where its output goes)."""
    code = f"from lightning_zero.runtime.ops import build_op; build_op({builder!r})"
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True, **popen)


def _build_in_child(builder: str, timeout_s: float) -> str | None:
    process = start_build(builder)
    try:
        status = process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"{builder} did not build within {timeout_s:.0f} s; {_stale_lock_hint()}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    return None if status == 0 else f"{builder} failed to build (exit status {status}; its output is above)"


def _stale_lock_hint() -> str:
    root = extension_build_directory("")
    locks = sorted(str(lock) for lock in root.glob("*/lock"))
    if locks:  # the waited-on lock may be another op's: one op's build can load another
        return f"if no other build is running, delete {', '.join(locks)} and run `lightning-zero build-ops` again"
    return f"no build lock is left under {root}; run `lightning-zero build-ops` again (built ops are kept)"
