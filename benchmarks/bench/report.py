"""From raw row records to the results table: throughput, MFU, ratios within the run, the reports beside ours.

Everything here is computed from ``results.jsonl`` alone, so ``reproduce.py report`` redraws the table, the CSV
and the plots on any machine, without a GPU.
"""

from __future__ import annotations

import csv
import dataclasses
import re
import statistics
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from benchmarks.bench.catalogue import EXPERIMENTS, Experiment, Kind, find_experiment

GIB = 1024**3
DEFAULT_PEAK_TFLOPS = 790.0


@dataclasses.dataclass(frozen=True)
class Metrics:
    """One row's figures."""

    key: str
    experiment: str
    lengths: str
    strategy: str
    status: str
    max_batch: int
    oom_batch: int | None
    at_limit: bool
    measured_batch: int | None = None
    fresh_ooms: tuple[int, ...] = ()
    timed_steps: int = 0
    skipped_steps: int = 0
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    step_s_median: float | None = None
    step_spread: float | None = None
    peak_reserved_gib: float | None = None
    peak_allocated_gib: float | None = None
    peak_host_gib: float | None = None
    setup_s: float | None = None
    epoch_s: float | None = None
    profile: Mapping[str, float] | None = None
    session: str = ""
    error: str | None = None
    fixed_batch: int | None = None
    auto_chosen: str | None = None
    auto_plan: Mapping[str, int] | None = None


def search_out_of_time(m: Metrics) -> bool:
    """Whether the search stopped on its time budget below the experiment's limit, with no batch out of memory:
    its batch is then only a lower bound of what fits."""
    return m.fixed_batch is None and m.max_batch > 0 and m.oom_batch is None and not m.at_limit


def _session_id(session: Mapping[str, Any]) -> str:
    return f"{session.get('host', '?')}:{session.get('gpu_uuid', '')}"


def metrics(record: Mapping[str, Any], peak_tflops: float = DEFAULT_PEAK_TFLOPS) -> Metrics:
    """The figures of one row record."""
    experiment = find_experiment(record["experiment"])
    base = Metrics(
        key=record["row"],
        experiment=record["experiment"],
        lengths=record["lengths"],
        strategy=record["strategy"],
        status=record["status"],
        max_batch=int(record.get("max_batch", 0)),
        oom_batch=record.get("oom_batch"),
        at_limit=bool(record.get("at_limit")),
        session=_session_id(record.get("session", {})),
        error=record.get("error"),
        measured_batch=record.get("measured_batch"),
        fresh_ooms=tuple(record.get("fresh_ooms", ())),
        fixed_batch=record.get("fixed_batch"),
    )
    measure = record.get("measure")
    if not measure:
        return base
    auto = measure.get("auto") or {}
    if auto:
        base = dataclasses.replace(
            base, auto_chosen=str(auto["chosen"]), auto_plan={name: int(batch) for name, batch in auto["plan"]}
        )
    world = int(measure.get("world_size", 1))
    batch = int(measure["batch"])
    good = [step for step in measure["steps"] if not step["skipped"]]
    seconds = sum(step["s"] for step in good)
    if not good or seconds <= 0:
        return dataclasses.replace(base, measured_batch=batch, skipped_steps=len(measure["steps"]))
    samples_per_s = len(good) * batch * world / seconds
    tokens_per_s = sum(step["tokens"] for step in good) * world / seconds
    flops = sum(step.get("flops", 0.0) for step in good)
    times = sorted(step["s"] for step in good)
    median = statistics.median(times)
    spread = (times[int(0.9 * (len(times) - 1))] - times[int(0.1 * (len(times) - 1))]) / median
    profile = _profile_shares(measure.get("profile") or [])
    return dataclasses.replace(
        base,
        measured_batch=batch,
        timed_steps=len(good),
        skipped_steps=len(measure["steps"]) - len(good),
        samples_per_s=samples_per_s,
        tokens_per_s=tokens_per_s,
        mfu=flops / seconds / (peak_tflops * 1e12) if flops else None,
        step_s_median=median,
        step_spread=spread,
        peak_reserved_gib=measure.get("peak_reserved", 0) / GIB,
        peak_allocated_gib=measure.get("peak_allocated", 0) / GIB,
        peak_host_gib=peak_host_bytes(measure) / GIB if peak_host_bytes(measure) else None,
        setup_s=measure.get("setup_s"),
        epoch_s=experiment.epoch_samples / samples_per_s if experiment.epoch_samples else None,
        profile=profile,
    )


def peak_host_bytes(measure: Mapping[str, Any]) -> int:
    """The host-memory peak of a measurement: the larger of the sampled peak of every rank's process tree and the
    kernel's exact high-water mark of rank 0's own process (both fall short of the true peak of the tree: the
    sample by what happens between samples, the mark by the other processes); 0 when neither was recorded."""
    return max(int(measure.get("peak_host_tree", 0)), int(measure.get("peak_rss", 0)))


def _profile_shares(steps: list[Mapping[str, float]]) -> dict[str, float] | None:
    if not steps:
        return None
    totals = {part: sum(step[part] for step in steps) for part in ("forward", "backward", "optimizer")}
    whole = sum(totals.values())
    return {part: value / whole for part, value in totals.items()} if whole > 0 else None


def _ratio(value: float | None, reference: float | None) -> float | None:
    if value is None or reference is None or reference == 0:
        return None
    return value / reference


@dataclasses.dataclass(frozen=True)
class TableRow:
    metrics: Metrics
    batch_vs_single: float | None
    speed_vs_single: float | None
    batch_vs_anchor: float | None
    speed_vs_anchor: float | None
    cross_session: bool


def usable_batch(m: Metrics) -> int | None:
    """The batch a user's run can train at: the one measured in a fresh process when the search's did not fit
    there; ``None`` when no fresh process fitted any (the search's figure is then only an upper bound)."""
    if m.fresh_ooms:
        return m.measured_batch if m.samples_per_s is not None else None
    if search_out_of_time(m):
        return None
    return m.max_batch or None


def table_rows(all_metrics: Iterable[Metrics]) -> list[TableRow]:
    """Each row with its ratios to the single-device row and to Lightning's anchor, same experiment and lengths."""
    by_key = {(m.experiment, m.lengths, m.strategy): m for m in all_metrics}
    rows = []
    for (name, lengths, _), m in by_key.items():
        experiment = find_experiment(name)
        single = by_key.get((name, lengths, "single"))
        anchor = by_key.get((name, lengths, experiment.anchor))
        sessions = {r.session for r in (m, single, anchor) if r is not None and r.samples_per_s}
        rows.append(
            TableRow(
                m,
                _ratio(usable_batch(m), usable_batch(single)) if single else None,
                _ratio(m.samples_per_s, single.samples_per_s) if single else None,
                _ratio(usable_batch(m), usable_batch(anchor)) if anchor else None,
                _ratio(m.samples_per_s, anchor.samples_per_s) if anchor else None,
                len(sessions) > 1,
            )
        )
    return rows


def _fmt(value: float | None, digits: int = 2, suffix: str = "") -> str:
    return "" if value is None else f"{value:.{digits}f}{suffix}"


def _batch_text(m: Metrics) -> str:
    """The search's bracket, and what a fresh process then fitted (the batch a user's run can use)."""
    if m.fixed_batch is not None:
        if m.status == "oom":
            return f"OOM at {m.fixed_batch} (set)"
        if m.auto_chosen:
            return f"{m.measured_batch} (zero_auto chose {m.auto_chosen})"
        return f"{m.fixed_batch} (set)" if m.status == "ok" else "error"
    if not m.max_batch:
        return "error" if m.status == "error" else f"OOM at {m.oom_batch or 1}"
    out_of_time = search_out_of_time(m)
    text = f">={m.max_batch}" if m.at_limit or out_of_time else str(m.max_batch)
    if out_of_time:
        text += " (search out of time)"
    if m.oom_batch:
        text += f" ({m.oom_batch} OOM)"
    if m.fresh_ooms:
        text += "; fresh run OOM at " + ", ".join(str(b) for b in m.fresh_ooms)
        if m.samples_per_s is not None:
            text += f", fits {m.measured_batch}"
    return text


HEADER = (
    "| strategy | max batch: search (first OOM); fresh run | samples/s | tokens/s | MFU | step s (p10-p90 spread)"
    " | timed / skipped | peak GiB reserved | peak host GiB | epoch s | x single: batch / speed"
    " | x Lightning: batch / speed"
    " | fwd/bwd/opt % |"
)


def markdown_table(rows: list[TableRow], experiment: Experiment, lengths: str) -> str:
    """One experiment at one length setting."""
    lines = [HEADER, "|" + "---|" * (HEADER.count("|") - 1)]
    for row in rows:
        m = row.metrics
        if m.experiment != experiment.name or m.lengths != lengths:
            continue
        mark = " †" if row.cross_session else ""
        profile = (
            "/".join(f"{100 * m.profile[p]:.0f}" for p in ("forward", "backward", "optimizer")) if m.profile else ""
        )
        spread = f" ({100 * m.step_spread:.0f}%)" if m.step_spread is not None else ""
        lines.append(
            f"| {m.strategy} | {_batch_text(m)} | {_fmt(m.samples_per_s, 1)} | {_fmt(m.tokens_per_s, 0)}"
            f" | {_fmt(100 * m.mfu if m.mfu else None, 1, '%')} | {_fmt(m.step_s_median, 3)}{spread}"
            f" | {m.timed_steps} / {m.skipped_steps} | {_fmt(m.peak_reserved_gib, 1)} | {_fmt(m.peak_host_gib, 1)}"
            f" | {_fmt(m.epoch_s, 1)}"
            f" | {_fmt(row.batch_vs_single)} / {_fmt(row.speed_vs_single)}{mark}"
            f" | {_fmt(row.batch_vs_anchor)} / {_fmt(row.speed_vs_anchor)}{mark} | {profile} |"
        )
    return "\n".join(lines)


def report_line(experiment: Experiment) -> str:
    """The report's own numbers and its ratio."""
    if experiment.report is None:
        return f"No report to reproduce ({experiment.source})."
    base, zero = experiment.report
    parts = []
    for row in (base, zero):
        batch = "OOM" if row.batch is None else str(row.batch)
        parts.append(f"{row.strategy} batch {batch}" + (f", {row.seconds} s" if row.seconds else ""))
    ratio = ""
    if base.batch and zero.batch:
        ratio = f"; batch x{zero.batch / base.batch:.2f}"
    if base.seconds and zero.seconds:
        ratio += f", speed x{base.seconds / zero.seconds:.2f}"
    return f"Report ({experiment.report_gpus} GPU): " + " vs ".join(parts) + ratio + "."


def _fit_speed(measured: Mapping[str, Any]) -> float | None:
    good = [step for step in measured["steps"] if not step["skipped"]]
    seconds = sum(step["s"] for step in good)
    return len(good) * measured["batch"] * measured.get("world_size", 1) / seconds if seconds else None


def plan_layout(label: str) -> str:
    """The plan's layout name of one of our preset rows (``zero2_offload+ac`` -> ``zero2_offload+ckpt``)."""
    base = label.split("@")[0].replace("+pin", "")
    return base.replace("+ac", "+ckpt")


def auto_section(rows: Iterable[TableRow]) -> str:
    """``zero_auto`` against our presets at the same set batch, and its plan against the searched batches."""
    metrics_list = [row.metrics for row in rows]
    lines = []
    for auto in metrics_list:
        if auto.auto_chosen is None or auto.fixed_batch is None:
            continue
        same = [m for m in metrics_list if (m.experiment, m.lengths) == (auto.experiment, auto.lengths)]
        for other in same:
            if other.key == auto.key or other.fixed_batch != auto.fixed_batch or other.auto_chosen:
                continue
            ratio = _ratio(auto.samples_per_s, other.samples_per_s)
            mark = " †" if auto.session != other.session else ""
            lines.append(
                f"| {auto.experiment} | {auto.strategy} ({auto.auto_chosen}) vs {other.strategy}"
                f" | {_fmt(auto.samples_per_s, 1)} vs {_fmt(other.samples_per_s, 1)} | {_fmt(ratio)}{mark} |"
            )
    plan_lines = []
    for auto in metrics_list:
        if not auto.auto_plan or auto.fixed_batch != 1:
            continue
        for other in metrics_list:
            if (other.experiment, other.lengths) != (auto.experiment, auto.lengths) or other.fixed_batch:
                continue
            predicted = auto.auto_plan.get(plan_layout(other.strategy))
            measured = usable_batch(other)
            if predicted is None or not measured:
                continue
            plan_lines.append(
                f"| {other.experiment} ({other.lengths}) | {other.strategy} | {predicted} | {measured}"
                f" | {predicted / measured:.2f} |"
            )
    text = ""
    if lines:
        text += (
            "### zero_auto against the presets at the same set batch († rows from different machines or GPUs)\n\n"
            "| experiment | rows | samples/s | ratio |\n|---|---|---|---|\n" + "\n".join(lines) + "\n"
        )
    if plan_lines:
        text += (
            "\n### The plan's predicted max micro-batch against the searched one (fresh run)\n\n"
            "| experiment | layout | plan | measured | plan / measured |\n|---|---|---|---|---|\n"
            + "\n".join(plan_lines)
            + "\n"
        )
    return text


def row_kind(m: Metrics) -> Kind | None:
    """Who provides the row's strategy (``None``: a label the catalogue no longer has)."""
    try:
        return find_experiment(m.experiment).strategy(m.strategy).kind
    except KeyError:
        return None


def fastest(rows: Iterable[Metrics], kind: Kind) -> Metrics | None:
    """The measured row of ``kind`` with the most tokens/s."""
    measured = [m for m in rows if row_kind(m) == kind and m.tokens_per_s]
    return max(measured, key=lambda m: m.tokens_per_s or 0.0) if measured else None


def _versus(m: Metrics, reference: Metrics | None) -> str:
    if reference is None:
        return ""
    mark = " †" if m.tokens_per_s and m.session != reference.session else ""
    return _fmt(_ratio(m.tokens_per_s, reference.tokens_per_s)) + mark


ANCHOR_HEADER = (
    "| strategy | max batch: search (first OOM); fresh run | tokens/s | MFU | peak GPU GiB | peak host GiB"
    " | set-up s | x best Lightning | x Accelerate |"
)


def anchor_section(rows: Iterable[TableRow]) -> str:
    """Every row of an experiment that has an Accelerate row, its tokens/s against the fastest Lightning row and
    the fastest Accelerate row of the same lengths: Lightning's and Accelerate's own DeepSpeed with Hugging Face
    checkpointing are the best their users can do. ``set-up s`` runs from the strategy's set-up to the first
    step: for ``zero_auto`` it holds its whole search."""
    metrics_list = [row.metrics for row in rows]
    sections = []
    for name, lengths in dict.fromkeys((m.experiment, m.lengths) for m in metrics_list):
        group = [m for m in metrics_list if (m.experiment, m.lengths) == (name, lengths)]
        if not any(row_kind(m) == "accelerate" for m in group):
            continue
        lightning, accelerate = fastest(group, "lightning"), fastest(group, "accelerate")
        lines = [
            f"### Anchors: {name}, lengths: {lengths}",
            "",
            f"Fastest Lightning row: {lightning.strategy if lightning else 'none measured'}; fastest Accelerate"
            f" row: {accelerate.strategy if accelerate else 'none measured'} († a ratio to a row from another"
            " machine or GPU).",
            "",
            ANCHOR_HEADER,
            "|" + "---|" * (ANCHOR_HEADER.count("|") - 1),
        ]
        for m in group:
            lines.append(
                f"| {m.strategy} | {_batch_text(m)} | {_fmt(m.tokens_per_s, 0)}"
                f" | {_fmt(100 * m.mfu if m.mfu else None, 1, '%')} | {_fmt(m.peak_reserved_gib, 1)}"
                f" | {_fmt(m.peak_host_gib, 1)} | {_fmt(m.setup_s, 0)} | {_versus(m, lightning)}"
                f" | {_versus(m, accelerate)} |"
            )
        sections.append("\n".join(lines) + "\n")
    return "\n".join(sections)


def compile_section(rows: Iterable[TableRow]) -> str:
    """Each ``+compile@B`` row against the same row without ``compile_blocks`` (same experiment, lengths, batch)."""
    by_key = {row.metrics.key: row.metrics for row in rows}
    lines = []
    for compiled in by_key.values():
        if "+compile@" not in compiled.strategy:
            continue
        eager = by_key.get(compiled.key.replace("+compile@", "@"))
        if eager is None:
            continue
        mark = " †" if eager.session != compiled.session else ""
        lines.append(
            f"| {compiled.experiment} ({compiled.lengths}) | {eager.strategy} vs {compiled.strategy}"
            f" | {_fmt(eager.samples_per_s, 1)} vs {_fmt(compiled.samples_per_s, 1)}"
            f" | {_fmt(_ratio(compiled.samples_per_s, eager.samples_per_s))}{mark}"
            f" | {_fmt(eager.peak_reserved_gib, 1)} vs {_fmt(compiled.peak_reserved_gib, 1)} |"
        )
    if not lines:
        return ""
    return (
        "### `compile_blocks` at the same batch († rows from different machines or GPUs)\n\n"
        "| workload | rows | samples/s | compiled / eager | peak GiB reserved |\n|---|---|---|---|---|\n"
        + "\n".join(lines)
        + "\n"
    )


_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b:?")


def error_reason(text: str) -> str:
    """A traceback's exception line (its message may run over more lines, which end with code), else its last."""
    lines = text.strip().splitlines() or ["incomplete"]
    return next((line for line in reversed(lines) if _EXCEPTION_LINE.match(line)), lines[-1]).replace("|", "/")


def overhead_section(records: Iterable[Mapping[str, Any]]) -> str:
    """Same-config overhead: ours against Lightning's built-in or Accelerate with the identical DeepSpeed config,
    interleaved."""
    lines = []
    for record in records:
        if not str(record.get("row", "")).startswith("overhead/"):
            continue
        ours, theirs = record["labels"]
        speeds: dict[str, list[float]] = {ours: [], theirs: []}
        for fit in record.get("fits", []):
            speed = _fit_speed(fit["measured"]) if fit.get("measured") else None
            if speed:
                speeds[fit["label"]].append(speed)
        if not speeds[ours] or not speeds[theirs]:
            reason = error_reason(str(record.get("error", "incomplete")))
            lines.append(f"| {record['experiment']} | {ours} vs {theirs} | {reason} | | | |")
            continue
        mean_ours, mean_theirs = statistics.mean(speeds[ours]), statistics.mean(speeds[theirs])
        each = " / ".join(f"{v:.1f}" for v in speeds[ours]) + " vs " + " / ".join(f"{v:.1f}" for v in speeds[theirs])
        spread = (
            max((max(v) - min(v)) / statistics.mean(v) for v in speeds.values() if len(v) > 1)
            if any(len(v) > 1 for v in speeds.values())
            else 0.0
        )
        lines.append(
            f"| {record['experiment']} ({record['lengths']}, batch {record['batch']}) | {ours} vs {theirs}"
            f" | {each} | {mean_ours / mean_theirs:.3f} | {100 * spread:.1f}% | {record['steps']} |"
        )
    if not lines:
        return ""
    head = (
        "### Same-config overhead (interleaved, identical DeepSpeed config; Lightning pairs in one process, Accelerate"
        " pairs one process a fit)\n\n"
        "| workload | ours vs theirs | samples/s per repeat | ours / theirs | largest repeat spread"
        " | timed steps |\n"
        "|---|---|---|---|---|---|"
    )
    return head + "\n" + "\n".join(lines)


def write_outputs(records: Iterable[Mapping[str, Any]], out: Path, peak_tflops: float = DEFAULT_PEAK_TFLOPS) -> str:
    """Write ``table.md`` and ``results.csv`` into ``out``; return the markdown."""
    records = list(records)
    rows = table_rows(
        metrics(r, peak_tflops) for r in records if not str(r.get("row", "overhead/")).startswith("overhead/")
    )
    sections = []
    names = [e.name for e in EXPERIMENTS]
    present = sorted({r.metrics.experiment for r in rows}, key=lambda n: names.index(n) if n in names else 99)
    for name in present:
        experiment = find_experiment(name)
        for lengths in [x.name for x in experiment.lengths]:
            if not any(r.metrics.experiment == name and r.metrics.lengths == lengths for r in rows):
                continue
            sections.append(f"### {name}, lengths: {lengths}\n\n{report_line(experiment)}\n\n")
            sections[-1] += markdown_table(rows, experiment, lengths)
    sections += [text for text in (anchor_section(rows), auto_section(rows), compile_section(rows)) if text]
    overhead = overhead_section(records)
    if overhead:
        sections.append(overhead)
    text = "\n\n".join(sections) + "\n"
    (out / "table.md").write_text(text)
    _write_csv(rows, out / "results.csv")
    return text


def _write_csv(rows: list[TableRow], path: Path) -> None:
    fields = [f.name for f in dataclasses.fields(Metrics) if f.name not in ("profile", "error")]
    extra = ["batch_vs_single", "speed_vs_single", "batch_vs_anchor", "speed_vs_anchor", "cross_session"]
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow([*fields, "forward_share", "backward_share", "optimizer_share", *extra])
        for row in rows:
            m = row.metrics
            shares = [m.profile.get(p) if m.profile else None for p in ("forward", "backward", "optimizer")]
            ratios = [row.batch_vs_single, row.speed_vs_single, row.batch_vs_anchor, row.speed_vs_anchor]
            writer.writerow([getattr(m, f) for f in fields] + shares + ratios + [row.cross_session])
