"""The multi-process launcher: a time-out kills the whole process group, grandchildren included."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.helpers.launch import run_script

pytestmark = pytest.mark.multiprocess  # every test here starts processes

_SPAWNS_A_GRANDCHILD = """
import subprocess, sys, time
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
open(sys.argv[1], "w").write(str(grandchild.pid))
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, killed but not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def test_a_time_out_kills_the_whole_process_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    with pytest.raises(AssertionError, match="timed out"):
        run_script(Path("-c"), _SPAWNS_A_GRANDCHILD, str(pid_file), timeout=3)
    grandchild = int(pid_file.read_text())  # it was started before the time-out
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(grandchild), "the grandchild outlived the time-out: only the child was killed"
