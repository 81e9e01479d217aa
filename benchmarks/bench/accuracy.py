"""Accuracy parity: the same fine-tune under single device and our presets, from the same seeds.

Each run is the product's own command, ``main.py fit``, over ``configs/quickstart.yaml`` (pretrained MiniLM-L6 on
the shipped movie reviews) with the strategy, seed, device and precision set, in a process of its own. The seed
is ``seed_everything`` (the new head's initialisation, dropout); the split and the batch order are the data
module's own, fixed, so runs of one seed differ only by strategy. The table gives
accuracy and F1 as mean ± standard deviation over seeds, and each strategy's mean difference from the single
device run of the same seed.
"""

from __future__ import annotations

import csv
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
BASE_CONFIG = REPO / "configs" / "quickstart.yaml"
REFERENCE = "single"
FIRST_PORT = 29611
CSV_LOGGER = "lightning.pytorch.loggers.CSVLogger"


@dataclass(frozen=True)
class FineTune:
    """What every run of one accuracy table shares.

    ``model`` (a folder) replaces the config's model and tokenizer and ``corpus_file`` its review corpus, for
    machines without the packages they ship in.
    """

    accelerator: str = "gpu"
    devices: int = 1
    precision: str = "bf16-mixed"
    limit_train: int | None = None
    batch_size: int = 32
    max_epochs: int = 1
    timeout_s: float = 600.0
    model: str | None = None
    corpus_file: str | None = None


def run_config(tune: FineTune, strategy: str, seed: int, root: Path) -> dict[str, Any]:
    """The quickstart config with this run's strategy, seed and hardware; logs to ``root/csv`` only."""
    config = yaml.safe_load(BASE_CONFIG.read_text())
    config["seed_everything"] = seed
    config["trainer"].update(
        accelerator=tune.accelerator,
        devices=tune.devices,
        strategy="auto" if strategy == REFERENCE else strategy,
        precision=tune.precision,
        max_epochs=tune.max_epochs,
        default_root_dir=str(root),
        enable_progress_bar=False,
        enable_checkpointing=False,
        callbacks=[],
        logger=[{"class_path": CSV_LOGGER, "init_args": {"save_dir": str(root), "name": "csv"}}],
    )
    data = config["data"]["init_args"]
    data.update(limit_train=tune.limit_train, batch_size=tune.batch_size)
    if tune.model is not None:
        config["model"]["init_args"]["model"] = data["tokenizer"] = tune.model
    if tune.corpus_file is not None:
        data["corpus_file"] = tune.corpus_file
    return config


def final_metrics(root: Path) -> dict[str, float]:
    """The last validation epoch's ``val_acc``, ``val_f1`` and ``val_loss`` from the run's CSV log."""
    path = root / "csv" / "version_0" / "metrics.csv"
    with path.open() as handle:
        rows = [row for row in csv.DictReader(handle) if row.get("val_acc")]
    if not rows:
        raise ValueError(f"{path} has no validation row")
    return {key: float(rows[-1][key]) for key in ("val_acc", "val_f1", "val_loss")}


def _start(tune: FineTune, strategy: str, seed: int, out: Path, port: int) -> tuple[subprocess.Popen[bytes], Path]:
    root = out / "runs" / f"{strategy}-seed{seed}"
    root.mkdir(parents=True, exist_ok=True)
    config = root / "config.yaml"
    config.write_text(yaml.safe_dump(run_config(tune, strategy, seed, root), sort_keys=False))
    log = (root / "log.txt").open("wb")
    command = [sys.executable, str(REPO / "main.py"), "fit", "--config", str(config)]
    environment = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    process = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=environment)
    return process, root


def _finish(process: subprocess.Popen[bytes], root: Path, started: float, timeout_s: float) -> dict[str, Any]:
    try:
        code = process.wait(timeout=max(1.0, timeout_s - (time.monotonic() - started)))
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return {"status": "error", "error": f"no result after {timeout_s:.0f} s"}
    wall_s = round(time.monotonic() - started, 1)
    if code != 0:
        tail = (root / "log.txt").read_text(errors="replace").strip().splitlines()[-1:] or [""]
        return {"status": "error", "error": f"exit {code}: {tail[0][-300:]}", "wall_s": wall_s}
    return {"status": "ok", **final_metrics(root), "wall_s": wall_s}


def load_records(out: Path) -> list[dict[str, Any]]:
    path = out / "accuracy.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def run_accuracy(
    out: Path, tune: FineTune, strategies: Sequence[str], seeds: Sequence[int], parallel: int
) -> list[dict[str, Any]]:
    """Run every (strategy, seed) not yet ``ok`` in ``out/accuracy.jsonl``, ``parallel`` processes at a time."""
    out.mkdir(parents=True, exist_ok=True)
    done = {(r["strategy"], r["seed"]) for r in load_records(out) if r["status"] == "ok"}
    pending = [(s, seed) for s in strategies for seed in seeds if (s, seed) not in done]
    for first in range(0, len(pending), parallel):
        group = pending[first : first + parallel]
        started = time.monotonic()
        running = [(s, seed, *_start(tune, s, seed, out, FIRST_PORT + 10 * i)) for i, (s, seed) in enumerate(group)]
        try:
            for strategy, seed, process, root in running:
                record = {"strategy": strategy, "seed": seed, **_finish(process, root, started, tune.timeout_s)}
                record["setting"] = {k: v for k, v in vars(tune).items() if k not in ("timeout_s", "corpus_file")}
                with (out / "accuracy.jsonl").open("a") as handle:
                    handle.write(json.dumps(record) + "\n")
                print(json.dumps(record), flush=True)
        finally:  # a run ended early (SIGTERM) ends the fine-tunes it started
            for *_, process, _ in running:
                if process.poll() is None:
                    process.kill()
                    process.wait()
    return load_records(out)


def _mean_std(values: Sequence[float]) -> str:
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.4f} ± {spread:.4f}"


def accuracy_table(records: Iterable[dict[str, Any]]) -> str:
    """Markdown: per strategy, seeds, accuracy and F1 as mean ± std, and the mean paired difference from single."""
    latest = {(r["strategy"], r["seed"]): r for r in records if r["status"] == "ok"}
    reference = {seed: r for (strategy, seed), r in latest.items() if strategy == REFERENCE}
    strategies = sorted({strategy for strategy, _ in latest}, key=lambda s: (s != REFERENCE, s))
    lines = [
        "| strategy | seeds | val_acc | val_f1 | acc - single (paired) | f1 - single (paired) | s per run |",
        "|---|---|---|---|---|---|---|",
    ]
    for strategy in strategies:
        runs = [r for (s, _), r in sorted(latest.items()) if s == strategy]
        paired = [r for r in runs if r["seed"] in reference] if strategy != REFERENCE else []
        differences = {
            key: _mean_std([r[key] - reference[r["seed"]][key] for r in paired]) if paired else ""
            for key in ("val_acc", "val_f1")
        }
        seeds = ",".join(str(r["seed"]) for r in runs)
        wall = statistics.mean(r["wall_s"] for r in runs)
        acc, f1 = (_mean_std([r[key] for r in runs]) for key in ("val_acc", "val_f1"))
        lines.append(
            f"| {strategy} | {seeds} | {acc} | {f1} | {differences['val_acc']} | {differences['val_f1']} | {wall:.0f} |"
        )
    return "\n".join(lines)
