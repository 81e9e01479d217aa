"""Bar charts of the committed GPU results: samples/s per strategy and batch, OOM runs marked.

python benchmarks/plot.py   (writes benchmarks/results_*.png beside each results_*.csv)
"""

from __future__ import annotations

import csv
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

HERE = Path(__file__).parent


def plot(results: Path) -> Path:
    with results.open() as handle:
        rows = list(csv.DictReader(handle))
    labels = [f"{row['strategy']}\nbatch {row['batch_per_gpu']}" for row in rows]
    speeds = [float(row["samples_per_s"] or 0) for row in rows]
    figure, axis = plt.subplots(figsize=(max(6, 1.6 * len(rows)), 4))
    bars = axis.bar(
        labels, speeds, color=["tab:gray" if "lightning" in row["strategy"] else "tab:blue" for row in rows]
    )
    for bar, row in zip(bars, rows, strict=True):
        text = f"{row['samples_per_s']}/s\n{row['peak_gib']} GiB" if row["status"] == "ok" else "OOM"
        axis.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8)
    first = rows[0]
    axis.set_title(
        f"{first['shape']}, 2x H200 capped to {first['memory_cap_gib']} GiB each,"
        f" {first['precision']}, seq {first['seq_len']}"
    )
    axis.set_ylabel("samples/s (2 GPUs)")
    axis.tick_params(axis="x", labelsize=8)
    figure.tight_layout()
    out = results.with_suffix(".png")
    figure.savefig(out, dpi=120)
    plt.close(figure)
    return out


def main() -> None:
    for results in sorted(HERE.glob("results_*.csv")):
        print(plot(results))


if __name__ == "__main__":
    main()
