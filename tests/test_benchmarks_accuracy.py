"""The accuracy-parity harness: its per-run config, its metrics reader, its table, and a failed run's record."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.bench import accuracy
from benchmarks.bench.accuracy import FineTune, accuracy_table, final_metrics, load_records, run_accuracy, run_config


def _record(strategy: str, seed: int, acc: float, f1: float) -> dict:
    return {"strategy": strategy, "seed": seed, "status": "ok", "val_acc": acc, "val_f1": f1, "wall_s": 10.0}


def test_run_config_sets_strategy_seed_hardware_and_logs_only_to_the_run(tmp_path: Path) -> None:
    tune = FineTune(accelerator="cpu", devices=2, precision="32-true", limit_train=64, batch_size=8)
    config = run_config(tune, "zero3", 7, tmp_path)
    assert config["seed_everything"] == 7
    trainer = config["trainer"]
    assert (trainer["strategy"], trainer["devices"], trainer["precision"]) == ("zero3", 2, "32-true")
    assert trainer["callbacks"] == [] and trainer["logger"][0]["init_args"]["save_dir"] == str(tmp_path)
    assert config["data"]["init_args"]["limit_train"] == 64 and config["data"]["init_args"]["batch_size"] == 8
    assert run_config(tune, "single", 7, tmp_path)["trainer"]["strategy"] == "auto"


def test_final_metrics_reads_the_last_validation_row(tmp_path: Path) -> None:
    metrics = tmp_path / "csv" / "version_0" / "metrics.csv"
    metrics.parent.mkdir(parents=True)
    metrics.write_text(
        "epoch,step,train_loss,val_acc,val_f1,val_loss\n0,9,0.7,,,\n0,9,,0.6,0.5,0.69\n1,19,,0.8,0.75,0.45\n1,19,0.4,,,\n"
    )
    assert final_metrics(tmp_path) == {"val_acc": 0.8, "val_f1": 0.75, "val_loss": 0.45}
    metrics.write_text("epoch,step,train_loss,val_acc\n0,9,0.7,\n")
    with pytest.raises(ValueError, match="no validation row"):
        final_metrics(tmp_path)


def test_table_gives_mean_std_and_the_difference_paired_by_seed() -> None:
    records = [
        _record("single", 1, 0.80, 0.82),
        _record("single", 2, 0.84, 0.86),
        _record("zero2", 1, 0.81, 0.82),
        _record("zero2", 2, 0.83, 0.84),
        {"strategy": "zero3", "seed": 1, "status": "error", "error": "exit 1"},
    ]
    table = accuracy_table(records).splitlines()
    assert table[2].startswith("| single | 1,2 | 0.8200 ± 0.0283 | 0.8400 ± 0.0283 |  |  |")
    # paired: +0.01 and -0.01 in accuracy, 0 and -0.02 in F1
    assert table[3].startswith("| zero2 | 1,2 | 0.8200 ± 0.0141 | 0.8300 ± 0.0141 | 0.0000 ± 0.0141 | -0.0100 ± 0.0141")
    assert len(table) == 4, "a failed run is left out of the table"


@pytest.mark.multiprocess
def test_a_failing_run_is_recorded_with_its_reason_and_retried_on_resume(tmp_path: Path) -> None:
    tune = FineTune(accelerator="cpu", precision="32-true", limit_train=8, batch_size=4, timeout_s=120)
    run_accuracy(tmp_path, tune, ["no_such_strategy"], [1], parallel=1)
    (record,) = load_records(tmp_path)
    assert record["status"] == "error" and "no_such_strategy" in record["error"], record
    run_accuracy(tmp_path, tune, ["no_such_strategy"], [1], parallel=1)
    assert len(load_records(tmp_path)) == 2, "what did not finish runs again"
    assert json.loads((tmp_path / "accuracy.jsonl").read_text().splitlines()[0])["seed"] == 1


@pytest.mark.multiprocess
def test_a_run_ended_early_ends_the_fine_tunes_it_started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[subprocess.Popen[bytes]] = []

    def start(*args: Any) -> tuple[subprocess.Popen[bytes], Path]:
        started.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]))
        return started[-1], tmp_path

    def ended_by_sigterm(*args: Any) -> dict[str, Any]:
        raise SystemExit(143)

    monkeypatch.setattr(accuracy, "_start", start)
    monkeypatch.setattr(accuracy, "_finish", ended_by_sigterm)
    tune = FineTune(accelerator="cpu", precision="32-true", limit_train=8, batch_size=4)
    with pytest.raises(SystemExit):
        run_accuracy(tmp_path, tune, ["zero2", "zero3"], [1], parallel=2)
    assert len(started) == 2 and all(process.poll() is not None for process in started)
