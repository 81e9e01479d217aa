"""PNG plots of a results table: max micro-batch and samples/s per strategy, one figure per experiment."""

from __future__ import annotations

from pathlib import Path

from benchmarks.bench.report import TableRow


def plot_experiments(rows: list[TableRow], out: Path, caption: str) -> list[Path]:
    """One PNG per experiment: bars of max batch and samples/s per strategy, a group per length setting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for name in sorted({r.metrics.experiment for r in rows}):
        mine = [r.metrics for r in rows if r.metrics.experiment == name]
        lengths = sorted({m.lengths for m in mine}, key=lambda x: (x != "fixed", x))
        strategies = list(dict.fromkeys(m.strategy for m in mine))
        figure, axes = plt.subplots(1, 2, figsize=(13, 4.8))
        width = 0.8 / max(1, len(lengths))
        for offset, length in enumerate(lengths):
            by_strategy = {m.strategy: m for m in mine if m.lengths == length}
            xs = [i + offset * width for i in range(len(strategies))]
            batches = [by_strategy[s].max_batch if s in by_strategy else 0 for s in strategies]
            speeds = [(by_strategy[s].samples_per_s or 0) if s in by_strategy else 0 for s in strategies]
            axes[0].bar(xs, batches, width, label=length)
            axes[1].bar(xs, speeds, width, label=length)
        for axis, title in zip(
            axes, ("max micro-batch under the cap (0 = OOM at 1)", "samples/s at that batch"), strict=True
        ):
            axis.set_xticks([i + width * (len(lengths) - 1) / 2 for i in range(len(strategies))])
            axis.set_xticklabels(strategies, rotation=35, ha="right", fontsize=8)
            axis.set_title(title, fontsize=10)
            axis.legend(fontsize=8)
        figure.suptitle(f"{name}: {caption}", fontsize=10)
        figure.tight_layout()
        path = out / f"{name}.png"
        figure.savefig(path, dpi=110)
        plt.close(figure)
        written.append(path)
    return written
