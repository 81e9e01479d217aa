"""The benchmark harness on CPU: batch search under an emulated memory cap, ranks agreeing, resume, the table.

The worker processes are real (one per rank, gloo); only the GPU memory is emulated: each rank "needs"
``base + per_sample * batch`` bytes and raises an out-of-memory error above the cap, like a GPU would.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from benchmarks.bench import catalogue
from benchmarks.bench.accelerate_run import deepspeed_config
from benchmarks.bench.catalogue import (
    ANCHOR_LABELS,
    EXPERIMENTS,
    OVERHEAD_PAIRS,
    StrategySpec,
    find_experiment,
    plan_rows,
)
from benchmarks.bench.controller import largest_live_blocks
from benchmarks.bench.flops import StepFlops
from benchmarks.bench.lengths import load_distribution
from benchmarks.bench.main import FlopAnnotator, for_lightning, main, selected_pairs
from benchmarks.bench.report import (
    Metrics,
    anchor_section,
    compile_section,
    markdown_table,
    overhead_section,
    table_rows,
)
from benchmarks.bench.runner import REPRODUCE, wait_for_build
from benchmarks.bench.search import SearchPolicy, bracket, next_candidate
from benchmarks.bench.worker import timing_done
from benchmarks.bench.workload import build_workload_model, uses_chunked_loss

GIB = 1024**3
COMMON = [
    "--accelerator", "cpu", "--precision", "32-true", "--cap-gib", "1", "--steps", "3", "--min-steps", "3",
    "--warmup", "1", "--profile-steps", "1", "--threads", "1", "--measure-budget-s", "20",
]  # fmt: skip


def _results(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def test_search_doubles_then_jumps_to_the_prediction_and_probes_one_step_up() -> None:
    policy = SearchPolicy(max_batch=512, tolerance=0.06)
    cap = 24 * GIB
    assert next_candidate([(1, 2 * GIB)], cap, policy) == 2
    # 1 GiB per sample over 4 GiB: the cap allows 20; the jump lands at 97% of it, then probes 6% higher.
    history = [(4, 8 * GIB), (8, 12 * GIB)]
    assert next_candidate(history, cap, policy) == 16
    history.append((16, 20 * GIB))
    assert next_candidate(history, cap, policy) == 19
    history.append((19, 23 * GIB))
    assert next_candidate(history, cap, policy) == 21
    assert next_candidate([(512, GIB)], cap, policy) is None
    assert next_candidate([(200, int(23.8 * GIB)), (210, int(23.5 * GIB))], cap, policy) == 223, (
        "no doubling at the cap"
    )
    assert bracket([1, 2, 19], [21, 40]).resolved(0.06, 512)
    assert not bracket([1, 2, 16], [32]).resolved(0.06, 512)
    assert bracket([], [1]).resolved(0.06, 512) and bracket([], [1]).fits == 0


def test_plan_puts_each_experiments_headline_rows_first_and_flops_grow_with_length() -> None:
    rows = plan_rows(list(EXPERIMENTS))
    t5_3b = [row.strategy for row in rows if row.experiment == "t5-3b"][:3]
    assert t5_3b == ["single", "lightning_ds2_offload+hf_gc", "zero2_offload+ac+pin"]
    assert rows[0].experiment == "t5-3b" and len({row.key for row in rows}) == len(rows)
    flops = StepFlops(1000, 0, 2, 0, 64, 0)
    assert flops.per_sample(128) > 2 * flops.per_sample(64)
    pairs = load_distribution("review-pairs")
    assert pairs.worst(128, 0)[0] <= 128 and pairs.summary()["source_mean"] < 64


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_two_ranks_agree_on_the_smaller_max_batch_and_a_rerun_resumes(tmp_path: Path) -> None:
    out = tmp_path / "two"
    # Rank 0 fits 5 (0.5 + 5 * 0.1 GiB), rank 1 only 4 (0.5 + 4 * 0.12): the row must say 4, first OOM at 5.
    args = ["run", "--out", str(out), "--experiments", "tiny-gpt2", "--strategies", "single", "--devices", "2"]
    main([*args, *COMMON, "--emulate-memory", "0.5:0.1,0.5:0.12"])
    (row,) = _results(out)
    assert (row["status"], row["max_batch"], row["oom_batch"]) == ("ok", 4, 5), row.get("error")
    assert row["measure"]["world_size"] == 2 and len(row["measure"]["steps"]) >= 3
    assert len(list((out / "trials").iterdir())) == 2, "one search process and one measurement expected"
    events = [json.loads(line) for trial in (out / "trials").iterdir() for line in (trial / "rank1.jsonl").open()]
    oom = next(event for event in events if event["event"] == "oom")
    assert "emulated memory cap: batch 5" in oom["where"], "an out-of-memory record says where it ran out"
    assert any(event["event"] == "first_step_end" for event in events), "a measurement records its first step"
    table = (out / "table.md").read_text()
    assert "| single | 4 (5 OOM) |" in table
    with (out / "results.csv").open() as handle:
        (line,) = list(csv.DictReader(handle))
    assert float(line["samples_per_s"]) > 0 and float(line["mfu"]) > 0
    main([*args, *COMMON, "--emulate-memory", "0.5:0.1,0.5:0.12"])
    assert len(_results(out)) == 1, "a rerun of the same command must skip the finished row"


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_one_process_measures_dynamic_lengths_padded_per_batch(tmp_path: Path) -> None:
    out = tmp_path / "one"
    args = ["run", "--out", str(out), "--experiments", "tiny-t5", "--strategies", "single", *COMMON]
    main([*args, "--emulate-memory", "0.5:0.1"])
    (row,) = _results(out)
    assert (row["max_batch"], row["oom_batch"]) == (5, 6)
    steps = row["measure"]["steps"]
    worst = load_distribution("reviews").worst(64, 64)
    assert all(step["source"] <= worst[0] and step["target"] <= worst[1] for step in steps)
    assert any(step["tokens"] < 5 * (step["source"] + step["target"]) for step in steps), "padding is counted apart"
    first_warmup, *_ = row["measure"]["warmup_steps"]
    assert (first_warmup["source"], first_warmup["target"]) == worst, "a fresh run must fit an epoch's longest batch"
    assert any(step["source"] < worst[0] for step in steps), "the timed steps must draw their lengths"


def test_a_measurement_takes_its_minimum_steps_however_long_they_take() -> None:
    good, skipped = {"skipped": False}, {"skipped": True}
    # 30 good steps, 15 s past a 5 s budget: the old guard (3x the budget) stopped here, short of 50.
    assert not timing_done([good] * 30, elapsed_s=15.0, steps=1000, min_steps=50, budget_s=5.0)
    assert timing_done([good] * 50, elapsed_s=25.0, steps=1000, min_steps=50, budget_s=5.0)
    assert not timing_done([good] * 60, elapsed_s=4.0, steps=1000, min_steps=50, budget_s=5.0), "budget not spent"
    assert not timing_done([good] * 49 + [skipped] * 3, elapsed_s=30.0, steps=1000, min_steps=50, budget_s=5.0)
    assert timing_done([skipped] * 50, elapsed_s=30.0, steps=1000, min_steps=50, budget_s=5.0), "fp16 gives up"


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_set_batch_rows_skip_the_search_and_zero_auto_rows_report_their_choice(tmp_path: Path) -> None:
    out = tmp_path / "auto"
    labels = "zero2@4,zero_auto@4,zero_auto+max"
    main(["run", "--out", str(out), "--experiments", "tiny-gpt2", "--strategies", labels, *COMMON])
    rows = {row["strategy"]: row for row in _results(out)}
    assert all(row["status"] == "ok" for row in rows.values()), {k: r.get("error") for k, r in rows.items()}
    assert rows["zero2@4"]["measure"]["batch"] == 4 and "search_trials" not in rows["zero2@4"]
    auto = rows["zero_auto@4"]["measure"]["auto"]
    micro = rows["zero_auto@4"]["measure"]["batch"]
    assert micro * auto["accumulation"] == 4, "zero_auto keeps the dataloader's batch as the global batch"
    tried = [name for name, *_ in auto["trials"]]
    # On one device the one-card lever is timed first, beyond max_trials (2 DeepSpeed candidates).
    assert len(tried) == 3 and tried[0].startswith("onecard_step_in_backward") and auto["chosen"] in tried
    assert rows["zero_auto+max"]["measure"]["batch"] > 4, "batch_size max trains a larger micro-batch"
    table = (out / "table.md").read_text()
    assert f"| zero_auto@4 | {micro} (zero_auto chose {auto['chosen']}) |" in table
    assert "| tiny-gpt2 | zero_auto@4 (" in table and "vs zero2@4 |" in table


def test_compiled_rows_are_compared_with_the_same_row_without_compilation() -> None:
    def row(strategy: str, speed: float, session: str = "a") -> Metrics:
        key = f"deberta/fixed/{strategy}"
        return Metrics(key, "deberta", "fixed", strategy, "ok", 64, None, False, samples_per_s=speed, session=session)

    rows = table_rows([row("zero2+ac@64", 100.0), row("zero2+ac+compile@64", 125.0), row("zero2+ac", 90.0)])
    text = compile_section(rows)
    assert "| deberta (fixed) | zero2+ac@64 vs zero2+ac+compile@64 | 100.0 vs 125.0 | 1.25 |" in text
    assert "†" not in text.split("\n", 1)[1]
    other_machine = table_rows([row("zero2+ac@64", 100.0), row("zero2+ac+compile@64", 80.0, session="b")])
    assert "| 0.80 † |" in compile_section(other_machine)
    assert compile_section(table_rows([row("zero2+ac@64", 100.0)])) == ""


def test_a_search_stopped_by_its_time_budget_gives_a_lower_bound_and_no_batch_ratio() -> None:
    def row(strategy: str, max_batch: int, oom_batch: int | None, at_limit: bool = False) -> Metrics:
        key = f"t5-3b/reviews/{strategy}"
        return Metrics(key, "t5-3b", "reviews", strategy, "ok", max_batch, oom_batch, at_limit, samples_per_s=50.0)

    anchor = next(e for e in EXPERIMENTS if e.name == "t5-3b").anchor
    cut = table_rows([row(anchor, 128, None), row("zero2_offload+ac", 512, None, at_limit=True)])
    assert cut[1].batch_vs_anchor is None and cut[1].speed_vs_anchor == 1.0
    table = markdown_table(cut, next(e for e in EXPERIMENTS if e.name == "t5-3b"), "reviews")
    assert f"| {anchor} | >=128 (search out of time) |" in table and "| zero2_offload+ac | >=512 |" in table
    bracketed = table_rows([row(anchor, 128, 129), row("zero2_offload+ac", 512, None, at_limit=True)])
    assert bracketed[1].batch_vs_anchor == 4.0


def test_the_same_config_goes_to_lightning_without_the_accumulation_it_sets_itself() -> None:
    config = {"train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 1, "zero_optimization": {}}
    assert for_lightning(config) == {"train_micro_batch_size_per_gpu": 16, "zero_optimization": {}}
    failed = {"row": "overhead/deberta/zero2~lightning_ds2", "experiment": "deberta", "labels": ["zero2", "ds2"]}
    traceback = "Traceback (most recent call last):\n  File ...\nMisconfigurationException: Do not set it.\n"
    assert "| deberta | zero2 vs ds2 | MisconfigurationException: Do not set it. |" in overhead_section(
        [{**failed, "error": traceback}]
    )
    # A message over several lines ends with code, not with the exception (DeepSpeed's zero.Init under jit):
    scripted = "File x\nNotSupportedError: Compiled functions can't:\n  def f(*args):\n    ~~~ <--- HERE\n"
    assert "| NotSupportedError: Compiled functions can't: |" in overhead_section([{**failed, "error": scripted}])


def test_the_same_config_pairs_are_chosen_by_name_and_resolve_in_every_experiment() -> None:
    assert [ours.label for ours, _ in selected_pairs("zero3,zero2")] == ["zero2", "zero3"]
    against_accelerate = selected_pairs("zero2_offload~accelerate_ds2_offload")
    assert [(ours.label, theirs.kind) for ours, theirs in against_accelerate] == [("zero2_offload", "accelerate")]
    assert [theirs.kind for _, theirs in selected_pairs("zero2_offload")] == ["lightning"]
    for experiment in EXPERIMENTS:
        for ours, theirs in OVERHEAD_PAIRS:
            assert experiment.strategy(ours.label).kind == "ours"
            assert experiment.strategy(theirs.label).kind in ("lightning", "accelerate")
    with pytest.raises(SystemExit, match=r"no pair for \['zero4'\]; choose from \['zero2', 'zero2~lightning_ds2'"):
        selected_pairs("zero2,zero4")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--experiments", "gpt2-xl", "--strategies", "zero3_offload@8"], r"--strategies: unknown \['zero3_offload@8"),
        (["--experiments", "deberta", "--lengths", "reviews"], r"--lengths: unknown \['reviews'\]; choose from"),
        (["--experiments", "gpt2"], r"--experiments: unknown experiment 'gpt2': choose from \['t5-3b'"),
    ],
)
def test_a_name_no_chosen_experiment_has_stops_the_run_before_it_starts(
    tmp_path: Path, flags: list[str], message: str
) -> None:
    with pytest.raises(SystemExit, match=message):
        main(["run", "--out", str(tmp_path / "out"), *flags, *COMMON])
    assert not (tmp_path / "out").exists()


def test_an_unknown_optimizer_stops_the_floor_before_it_times_any() -> None:
    with pytest.raises(SystemExit, match=r"--optimizers: unknown \['adam'\]; choose from \['deepspeed'"):
        main(["floor", "--parameters", "1e3", "--optimizers", "fused,adam"])


_BENCH_SETUP_IMPORTS = """
import sys
from benchmarks.bench.catalogue import EXPERIMENTS
from benchmarks.bench.workload import BenchModule
from lightning_zero.app.models.shapes import shape_config
def modeling_module(experiment):
    model_type = shape_config(f"shape:{experiment.shape}").model_type.replace("-", "_")
    return f"transformers.models.{model_type}.modeling_{model_type}"
imported_first = [modeling_module(e) for e in EXPERIMENTS if modeling_module(e) in sys.modules]
assert not imported_first, imported_first
for experiment in EXPERIMENTS:
    BenchModule(experiment, experiment.strategies[0], experiment.lengths[0], None, 0.0).setup("fit")
    assert modeling_module(experiment) in sys.modules, modeling_module(experiment)
"""


@pytest.mark.multiprocess
def test_the_bench_module_imports_its_modeling_module_before_zero3_builds_the_model() -> None:
    # Under ZeRO-3, DeBERTa-v2's module (transformers 5.17) fails to import inside zero.Init (the GPU's pair did).
    result = subprocess.run([sys.executable, "-c", _BENCH_SETUP_IMPORTS], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


_LIGHTNING_ZERO3_BUILD = """
import dataclasses, os, socket, sys
from types import SimpleNamespace
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
import deepspeed
from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled
from benchmarks.bench.catalogue import OVERHEAD_PAIRS, find_experiment
from benchmarks.bench.workload import BenchModule
deepspeed.init_distributed("gloo")
experiment = dataclasses.replace(find_experiment("deberta"), shape="tiny-deberta-v2", vocab_size=512)
lightning_ds3 = next(lightning for ours, lightning in OVERHEAD_PAIRS if lightning.strategy == "deepspeed_stage_3")
module = BenchModule(experiment, lightning_ds3, experiment.lengths[0], None, 0.0)
config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}
module._trainer = SimpleNamespace(strategy=SimpleNamespace(zero_stage_3=True, config=config), global_rank=0)
module.setup("fit")
with deepspeed.zero.Init(config_dict_or_path=config):  # what Lightning's strategy opens around configure_model
    module.configure_model()
assert all(p.ds_numel > 0 for p in module.model.parameters())
module.teardown("fit")
assert not is_deepspeed_zero3_enabled()
"""


@pytest.mark.multiprocess
def test_under_lightnings_zero3_the_bench_module_builds_a_model_with_a_padding_row() -> None:
    # Built in Lightning's zero.Init without transformers knowing, DeBERTa-v2 fails to initialise its padding row.
    result = subprocess.run([sys.executable, "-c", _LIGHTNING_ZERO3_BUILD], capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_run_ended_by_sigterm_ends_its_trial_processes(tmp_path: Path) -> None:
    args = ["run", "--out", str(tmp_path), "--experiments", "tiny-gpt2", "--strategies", "single", *COMMON]
    harness = psutil.Popen([sys.executable, str(REPRODUCE), *args, "--emulate-memory", "0.5:0.1"])
    deadline = time.monotonic() + 90
    while not (trials := harness.children(recursive=True)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert trials, "no trial process started"
    harness.send_signal(signal.SIGTERM)
    assert harness.wait(timeout=30) == 128 + signal.SIGTERM
    _, alive = psutil.wait_procs(trials, timeout=10)
    assert alive == [], "a trial outlived the run"


@pytest.mark.multiprocess
def test_a_build_is_waited_for_and_ended_when_it_outlasts_its_limit() -> None:
    def sleeper(seconds: float) -> subprocess.Popen:
        code = f"import time; time.sleep({seconds})"
        return subprocess.Popen([sys.executable, "-c", code], start_new_session=True)

    quick = sleeper(1)
    wait_for_build(quick, timeout_s=60)
    assert quick.returncode == 0, "the build was not waited for"
    stuck = sleeper(600)
    wait_for_build(stuck, timeout_s=1)
    assert stuck.returncode is not None, "the build outlasting its limit was not ended"


def test_the_largest_live_blocks_of_a_memory_snapshot_leave_out_free_ones() -> None:
    mib = 2**20
    segments = [
        {"blocks": [{"size": 3 * mib, "state": "active_allocated"}, {"size": 9 * mib, "state": "inactive"}]},
        {"blocks": [{"size": 5 * mib, "state": "active_allocated"}, {"size": mib // 2, "state": "active_allocated"}]},
    ]
    assert largest_live_blocks(segments) == [5.0, 3.0, 0.5]
    assert largest_live_blocks(segments, count=1) == [5.0]


ANCHOR_KINDS = {
    "lightning_ds2_offload+hf_gc": "lightning",
    "lightning_ds3_offload+hf_gc": "lightning",
    "accelerate_ds3_offload+hf_gc": "accelerate",
    "zero3_offload_fsdp+ac": "fsdp2",
    "zero_auto+max": "auto",
    "zero_auto+approx": "auto",
}


@pytest.mark.parametrize("name", ["llama-3.2-3b", "llama-3.1-8b", "gpt2-xl", "t5-3b"])
def test_every_model_that_needs_offload_has_the_anchor_rows(name: str) -> None:
    experiment = find_experiment(name)
    specs = {label: experiment.strategy(label) for label in ANCHOR_LABELS}
    assert {label: spec.kind for label, spec in specs.items()} == ANCHOR_KINDS
    for spec in specs.values():
        if spec.kind in ("lightning", "accelerate"):
            assert spec.hf_checkpointing and spec.offloads and spec.batch is None, spec
    assert specs["zero_auto+approx"].zero == {"batch_size": "max", "approximate": True}
    assert {row.strategy for row in plan_rows([experiment], list(ANCHOR_LABELS))} == set(ANCHOR_LABELS)


def test_the_llama_workloads_train_packed_2048_token_blocks_in_bf16_with_a_flop_model() -> None:
    annotate = FlopAnnotator()
    for name, body in (("llama-3.2-3b", 2.8e9), ("llama-3.1-8b", 7.0e9)):
        experiment = find_experiment(name)
        assert (experiment.precision, experiment.loss_chunk_tokens) == ("bf16-mixed", 1024)
        assert [(x.name, x.source, x.dynamic) for x in experiment.lengths] == [("fixed", 2048, False)]
        # 6 FLOPs per weight and token, at least: the transformer body without embeddings
        assert annotate.flop_model(name).per_sample(2048) > 6 * body * 2048


def test_only_our_deepspeed_rows_compute_the_llama_loss_in_chunks() -> None:
    twin = find_experiment("tiny-llama")
    model = build_workload_model(twin, twin.strategies[0])
    chunked = {spec.label: uses_chunked_loss(twin, spec, model) for spec in twin.strategies}
    assert chunked == {
        "lightning_ds3_offload+hf_gc@2": False,
        "accelerate_ds3_offload+hf_gc@2": False,
        "zero3_offload_fsdp+ac@2": False,  # CausalLMTask refuses the chunked loss under FSDP
        "accelerate_ds3_offload+hf_gc": False,
        "zero3_offload+ac@2": True,
    }
    assert model.is_gradient_checkpointing, "the Lightning anchor switches Hugging Face checkpointing on"
    unchunked = dataclasses.replace(twin, loss_chunk_tokens=None)
    assert not uses_chunked_loss(unchunked, twin.strategy("zero3_offload+ac@2"), model)


def test_the_accelerate_row_is_zero3_with_both_offloads_and_no_clipping_as_accelerate_reads_it() -> None:
    from accelerate.utils import DeepSpeedPlugin

    plugin = DeepSpeedPlugin(hf_ds_config=deepspeed_config(find_experiment("llama-3.1-8b").strategy(ANCHOR_LABELS[2])))
    zero = plugin.deepspeed_config["zero_optimization"]
    assert (plugin.zero_stage, plugin.offload_optimizer_device, plugin.offload_param_device) == (3, "cpu", "cpu")
    assert plugin.zero3_init_flag, "the model is built partitioned, as Accelerate does under ZeRO-3"
    assert plugin.deepspeed_config["gradient_clipping"] == 0.0 and zero["stage3_prefetch_bucket_size"] == "auto"
    layouts = r"\['zero2_offload', 'zero3_offload'\]"
    with pytest.raises(ValueError, match=rf"no Accelerate layout for 'zero2': choose from {layouts}"):
        deepspeed_config(StrategySpec("accelerate_ds2", "accelerate", "zero2"))


def test_the_anchor_table_compares_each_row_with_the_fastest_lightning_and_accelerate_rows() -> None:
    def row(strategy: str, tokens: float, session: str = "a", experiment: str = "gpt2-xl") -> Metrics:
        key = f"{experiment}/fixed/{strategy}"
        return Metrics(key, experiment, "fixed", strategy, "ok", 16, 17, False, tokens_per_s=tokens, session=session)

    rows = table_rows(
        [
            row("lightning_ds3_offload+hf_gc", 1000.0),
            row("lightning_ds2_offload+hf_gc", 1250.0),
            row("accelerate_ds3_offload+hf_gc", 800.0),
            row("zero_auto+max", 2500.0, session="b"),
            row("lightning_ds2", 900.0, experiment="deberta"),
        ]
    )
    text = anchor_section(rows)
    assert "Fastest Lightning row: lightning_ds2_offload+hf_gc; fastest Accelerate row: accelerate_ds3" in text
    assert "| lightning_ds3_offload+hf_gc | 16 (17 OOM) | 1000 |" in text and "| 0.80 | 1.25 |" in text
    assert "| 2.00 † | 3.12 † |" in text, "a ratio to another machine's row is marked"
    assert "deberta" not in text, "an experiment without an Accelerate row has no anchor table"


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_the_tiny_llama_anchors_run_in_one_launch_and_the_report_shows_them(tmp_path: Path) -> None:
    out = tmp_path / "anchors"
    labels = "lightning_ds3_offload+hf_gc@2,accelerate_ds3_offload+hf_gc@2,accelerate_ds3_offload+hf_gc"
    args = ["run", "--out", str(out), "--experiments", "tiny-llama", "--strategies", labels, *COMMON]
    main([*args, "--emulate-memory", "0.5:0.1"])
    rows = {row["strategy"]: row for row in _results(out)}
    assert all(row["status"] == "ok" for row in rows.values()), {k: r.get("error") for k, r in rows.items()}
    searched = rows["accelerate_ds3_offload+hf_gc"]
    assert (searched["max_batch"], searched["oom_batch"]) == (5, 6), "Accelerate's loop runs the same search"
    for row in rows.values():
        measure = row["measure"]
        assert len(measure["steps"]) >= 3 and measure["peak_host_tree"] > 0 and measure["peak_rss"] > 0
    table = (out / "table.md").read_text()
    assert "| peak GiB reserved | peak host GiB |" in table
    assert "### Anchors: tiny-llama, lengths: fixed" in table
    assert "fastest Accelerate row: accelerate_ds3_offload+hf_gc " in table
    assert "| lightning_ds3_offload+hf_gc@2 | 2 (set) |" in table
    with (out / "results.csv").open() as handle:
        host = {line["strategy"]: float(line["peak_host_gib"]) for line in csv.DictReader(handle)}
    assert all(gib > 0.1 for gib in host.values()), host


def test_an_accelerate_row_in_a_precision_accelerate_cannot_name_stops_the_run_before_it_starts(
    tmp_path: Path,
) -> None:
    args = ["run", "--out", str(tmp_path / "out"), "--experiments", "gpt2-xl"]
    with pytest.raises(SystemExit, match=r"--precision: gpt2-xl/fixed/accelerate_ds3_offload\+hf_gc runs through"):
        main([*args, "--strategies", "accelerate_ds3_offload+hf_gc", *COMMON, "--precision", "64-true"])
    assert not (tmp_path / "out").exists()


def test_a_row_with_a_field_its_preset_lacks_stops_the_run_before_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    typo = StrategySpec("zero2+typo", "ours", "zero2", {"activation_checkpoint": True})
    bad = dataclasses.replace(find_experiment("tiny-gpt2"), name="tiny-typo", strategies=(typo,))
    monkeypatch.setattr(catalogue, "SMOKE_EXPERIMENTS", (*catalogue.SMOKE_EXPERIMENTS, bad))
    args = ["run", "--out", str(tmp_path / "out"), "--experiments", "tiny-typo", *COMMON]
    with pytest.raises(SystemExit, match=r"--strategies: tiny-typo/fixed/zero2\+typo: .*'activation_checkpoint'"):
        main(args)
    assert not (tmp_path / "out").exists()
