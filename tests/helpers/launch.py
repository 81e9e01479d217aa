"""Run a multi-process script under a hard timeout that kills its whole process group.

When one rank fails, Lightning's launcher can leave the other rank running for ever; a test that waits
on it would hang CI. Every multi-process test goes through :func:`run_script`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


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


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def _tail(output: str, lines: int = 60) -> str:
    return "\n".join(output.splitlines()[-lines:])
