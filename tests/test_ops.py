"""``lightning-zero build-ops`` ends, with a reason, and a run loads an op, even where torch's extension builder
would wait for ever."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import lightning as L
import pytest

import lightning_zero  # noqa: F401  (registers the presets)
from lightning_zero.runtime import ops
from lightning_zero.runtime.ops import build_cpu_ops, build_lock, remove_stale_lock, wait_for_build_lock
from lightning_zero.strategies import deepspeed as zero_deepspeed


@pytest.mark.multiprocess
def test_a_killed_builds_lock_file_ends_in_an_error_that_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    (tmp_path / "deepspeed_shm_comm").mkdir()
    (tmp_path / "deepspeed_shm_comm" / "lock").touch()  # what a build killed half-way leaves behind
    failures = build_cpu_ops(["ShareMemCommBuilder"], timeout_s=6)
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


def _locked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, age_s: float = 0.0) -> Path:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    lock = build_lock("cpu_adam")
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.touch()
    os.utime(lock, (time.time() - age_s, time.time() - age_s))
    return lock


def test_a_run_waits_for_a_build_that_holds_the_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lock = _locked(tmp_path, monkeypatch)
    threading.Timer(0.5, lock.unlink).start()  # the other process's build ends
    wait_for_build_lock("cpu_adam", poll_s=0.05)
    assert not lock.exists()  # returned only once the build was over


def test_a_killed_builds_lock_is_removed_once_it_is_as_old_as_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    lock = _locked(tmp_path, monkeypatch, age_s=3600)
    wait_for_build_lock("cpu_adam")
    assert not lock.exists() and f"removed {lock}" in capsys.readouterr().err
    lock = _locked(tmp_path, monkeypatch)  # killed just now: waited for, and said so, until the limit
    monkeypatch.setattr(ops, "LOCK_NOTICE_S", 0.0)
    wait_for_build_lock("cpu_adam", limit_s=1.0, poll_s=0.05)
    assert not lock.exists()
    assert f"waiting for {lock}: another process is building DeepSpeed's cpu_adam" in capsys.readouterr().err


def test_a_deepspeed_run_on_cpu_waits_on_the_shared_memory_ops_lock_first(monkeypatch: pytest.MonkeyPatch) -> None:
    order: list[str] = []
    monkeypatch.setattr(zero_deepspeed, "wait_for_op", order.append)
    strategy = L.Trainer(strategy="zero2", accelerator="cpu", devices=1, logger=False).strategy
    assert isinstance(strategy, zero_deepspeed.ZeroStrategy)
    monkeypatch.setattr(strategy, "_init_deepspeed_distributed", lambda: order.append("DeepSpeed's init"))
    strategy.setup_distributed()
    assert order == ["ShareMemCommBuilder", "DeepSpeed's init"]
