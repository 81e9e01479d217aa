"""``lightning-zero build-ops`` ends, with a reason, even where torch's extension builder would wait for ever."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from lightning_zero.strategies.ops import build_cpu_ops, remove_stale_lock


def test_a_killed_builds_lock_file_ends_in_an_error_that_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    (tmp_path / "deepspeed_shm_comm").mkdir()
    (tmp_path / "deepspeed_shm_comm" / "lock").touch()  # what a build killed half-way leaves behind
    start = time.monotonic()
    failures = build_cpu_ops(["ShareMemCommBuilder"], timeout_s=6)
    assert time.monotonic() - start < 60
    assert len(failures) == 1
    lock = tmp_path / "deepspeed_shm_comm" / "lock"
    assert failures[0] == (
        f"ShareMemCommBuilder did not build within 6 s; if no other build is running, delete {lock} and run"
        " `lightning-zero build-ops` again"
    )


def test_only_a_lock_older_than_any_build_is_removed(tmp_path: Path) -> None:
    lock = tmp_path / "lock"
    assert not remove_stale_lock(lock, 900)
    lock.touch()
    assert not remove_stale_lock(lock, 900) and lock.exists()
    an_hour_ago = time.time() - 3600
    os.utime(lock, (an_hour_ago, an_hour_ago))
    assert remove_stale_lock(lock, 900) and not lock.exists()
