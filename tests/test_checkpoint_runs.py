"""Checkpoints in real runs: exact resume from a mid-epoch step checkpoint for DDP and every preset, epoch-end
``max_steps`` saves, kill -9 during a save, and consolidation of what the runs saved (to safetensors, a torch file,
and a Hugging Face folder loaded in a fresh interpreter).

The 2-process runs (helpers/checkpoint_run.py, one launch for every strategy) train the tiny GPT-2 with dropout on
shuffled data for 14 steps (6 an epoch) with ``ModelCheckpoint(every_n_train_steps=5, save_last="link")``; a
fresh module with perturbed weights and a fresh Trainer then resume with ``ckpt_path="last"`` (step 10, the 4th
batch of the second epoch) to step 14. Tolerance: none. Every strategy, CPU Adam (DeepSpeed offload) included,
runs the same float32 operations in the same order on the same machine, so the resumed run is bit-identical:
same batches, losses, learning rate and final weights (measured: max difference 0.0 for all eleven).

Resuming at another size, stage or backend (DeepSpeed ZeRO-1/2/3 with and without offload, FSDP2, FairScale): the
resumed run's losses and weights against the uninterrupted run's, and the optimizer state it loaded, gathered by
parameter name, against the source's at its save (one row per pair in docs/checkpoints.md).

Kill -9 during a save: rank 1 is killed after writing its shards of the step-10 checkpoint, before it is published.
The step-5 checkpoint stays ``last`` and loads; running the same command again reaches the uninterrupted weights.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from safetensors.torch import load_file

from lightning_zero.app.cli import main
from lightning_zero.app.consolidate import consolidate
from lightning_zero.checkpoint.atomic import PARTIAL_SUFFIX
from lightning_zero.checkpoint.manifest import Manifest, ModelSignature, read_manifest
from lightning_zero.checkpoint.reshard import (
    NATIVE,
    NVME_NOT_CARRIED,
    UNIVERSAL,
    UNIVERSAL_SUFFIX,
    WEIGHTS_ONLY,
    has_nvme_optimizer_state,
    resume_route,
    why_not_carried,
)
from lightning_zero.checkpoint.resume import ExactResume, fix_epoch_end_loop_state
from lightning_zero.checkpoint.validate import check_checkpoint
from tests.helpers.backend_runs import ShortEpochLM
from tests.helpers.checkpoint_run import DropoutLM
from tests.helpers.launch import REPO, run_script
from tests.helpers.shared_launch import SharedLaunch
from tests.helpers.trainer import quiet_trainer

RUNNER = Path(__file__).parent / "helpers" / "checkpoint_run.py"
STRATEGIES = [
    "ddp",
    "zero1",
    "zero2",
    "zero2_offload",
    "zero3",
    "zero3_offload",
    "zero1_fairscale",
    "zero2_fairscale",
    "zero2_fsdp",
    "zero3_fsdp",
    "zero3_offload_fsdp",
]
STEPS, EVERY = 14, 5
CROSS = ["zero2>zero2", "zero3_fsdp>zero2_fsdp", "zero2>zero3", "zero3_fsdp>zero2", "zero2>zero2_fsdp"]
#: Pairs with no route that carries the optimizer state: they resume weights-only, with one warning.
WEIGHTS_ONLY_CROSS = ["zero3_offload>ddp", "zero3_fsdp>ddp"]
#: A ZeRO checkpoint under a one-card preset, with no callback of ours: weights only, with one warning.
ONE_CARD_CROSS = "zero3_fsdp>onecard_step_in_backward"
CROSS_SOURCES = sorted({pair.split(">")[0] for pair in CROSS + WEIGHTS_ONLY_CROSS})


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every 2-process run of the module, in one launch: the exact resumes, the sources of the cross resumes, the
    pruned run, and the grouped sources with their same-size resumes at another stage (:func:`regrouped`)."""
    out = tmp_path_factory.mktemp("resume")
    runs = [f"resume:{name}" for name in STRATEGIES] + [f"plain:{name}" for name in CROSS_SOURCES] + ["prune:zero3"]
    runs += [*(f"grouped:{name}" for name in GROUPED_SOURCES), *(f"grouped-cross:{pair}" for pair in SAME_SIZE)]
    run_script(RUNNER, str(out), "--steps", str(STEPS), "--every", str(EVERY), "--runs", *runs, timeout=1200)
    return out


@pytest.fixture(scope="module")
def resumed(two_processes: Path) -> Path:
    return two_processes


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[key] - b[key]).abs().max().item() for key in a)


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", STRATEGIES)
def test_resume_from_mid_epoch_step_checkpoint_is_exact(resumed: Path, name: str) -> None:
    result = torch.load(resumed / f"resume-{name}.pt", weights_only=False)
    uninterrupted, again = result["uninterrupted"], result["resumed"]
    start = (STEPS // EVERY) * EVERY
    assert again["global_step"] == uninterrupted["global_step"] == STEPS
    assert again["batch_fingerprints"] == uninterrupted["batch_fingerprints"][start:]
    assert again["losses"] == uninterrupted["losses"][start:]
    assert again["lr"] == uninterrupted["lr"]
    assert max_difference(again["state_dict"], uninterrupted["state_dict"]) == 0.0


def fit(steps: int, directory: Path, ckpt_path: str | None = None, **saving: Any) -> ShortEpochLM:
    L.seed_everything(7, verbose=False)
    module = ShortEpochLM()  # 48 samples, 12 steps an epoch in one process
    saver = ModelCheckpoint(dirpath=directory, save_last=True, save_top_k=-1, **saving)
    trainer = quiet_trainer(
        devices=1,
        max_steps=steps,
        callbacks=[saver, ExactResume()],
        enable_checkpointing=True,
    )
    trainer.fit(module, ckpt_path=ckpt_path)
    return module


@pytest.mark.parametrize(
    ("stop", "saving"),
    [
        pytest.param(12, {"save_on_train_epoch_end": True}, id="epoch-end"),
        pytest.param(8, {"save_on_train_epoch_end": True}, id="epoch-cut-short-by-max-steps"),
        pytest.param(12, {"every_n_train_steps": 12}, id="last-batch-of-epoch"),
        pytest.param(8, {"every_n_train_steps": 8}, id="mid-epoch"),
    ],
)
def test_max_steps_run_resumes_without_skipping_or_replaying(
    tmp_path: Path, one_thread: None, stop: int, saving: dict[str, Any]
) -> None:
    reference = fit(2 * stop, tmp_path / "reference")
    fit(stop, tmp_path / "run", **saving)
    resumed = fit(2 * stop, tmp_path / "run", ckpt_path="last", **saving)
    assert resumed.batch_fingerprints == reference.batch_fingerprints[stop:]
    assert max_difference(resumed.state_dict(), reference.state_dict()) == 0.0


def test_epoch_end_loop_state_becomes_the_last_batch_end_state() -> None:
    progress = {"ready": 1, "started": 1, "processed": 1, "completed": 0}
    batches = {"ready": 12, "started": 12, "processed": 12, "completed": 12}
    loops: dict[str, Any] = {
        "fit_loop": {
            "epoch_progress": {"total": dict(progress), "current": dict(progress)},
            "epoch_loop.batch_progress": {"total": dict(batches), "current": dict(batches), "is_last_batch": True},
        }
    }
    assert fix_epoch_end_loop_state(loops)
    fit_loop = loops["fit_loop"]
    assert fit_loop["epoch_progress"]["total"]["processed"] == 0
    assert fit_loop["epoch_loop.batch_progress"]["current"]["completed"] == 11
    assert not fix_epoch_end_loop_state(loops), "a state written on a batch end is left as it is"


KILLED = "zero3"
#: How long the surviving rank is given to end by itself after the other was killed (today it waits in a barrier
#: until the group is killed; once the launcher's watchdog has merged, assert that it ended, non-zero).
ORPHAN_WAIT_S = 60  # the other rank must end by itself within this


def launch_and_kill_rank_1_in_a_save(out: Path) -> None:
    command = [sys.executable, str(RUNNER), str(out), "--steps", str(STEPS), "--every", str(EVERY)]
    log = (out / "killed.log").open("w")
    process = subprocess.Popen(
        [*command, "--runs", f"killed:{KILLED}"], cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    marker, deadline = out / "saving-pid", time.monotonic() + 300
    try:
        while not marker.exists():
            assert process.poll() is None, (out / "killed.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "rank 1 never reached the save at step 10"
            time.sleep(0.5)
        time.sleep(0.2)  # the pid is written
        os.kill(int(marker.read_text()), signal.SIGKILL)
        # The rank watchdog ends the surviving rank by itself, naming the killed one.
        assert process.wait(timeout=ORPHAN_WAIT_S) != 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        log.close()


@pytest.mark.multiprocess
def test_kill_9_during_a_save_keeps_last_loadable_and_the_restart_reaches_the_same_weights(
    resumed: Path, tmp_path: Path
) -> None:
    launch_and_kill_rank_1_in_a_save(tmp_path)
    log = (tmp_path / "killed.log").read_text()
    # Our watchdog names the killed rank, unless Lightning's launcher (polling every 5 s) does first.
    assert "error: rank 1 (pid" in log or "[rank: 1] Child process with PID" in log, log[-3000:]
    directory = tmp_path / f"ckpt-{KILLED}"
    unfinished = directory / f"epoch=1-step={2 * EVERY}.ckpt"
    assert not unfinished.exists()
    assert unfinished.with_name(unfinished.name + PARTIAL_SUFFIX).is_dir()
    last = directory / "last.ckpt"
    check_checkpoint(last)
    manifest = read_manifest(last)
    assert manifest is not None and manifest.step == EVERY

    run_script(RUNNER, str(tmp_path), "--steps", str(STEPS), "--every", str(EVERY), "--runs", f"restart:{KILLED}")
    restarted = torch.load(tmp_path / f"restart-{KILLED}.pt", weights_only=False)
    uninterrupted = torch.load(resumed / f"resume-{KILLED}.pt", weights_only=False)["uninterrupted"]
    assert restarted["batch_fingerprints"] == uninterrupted["batch_fingerprints"][EVERY:]
    assert max_difference(restarted["state_dict"], uninterrupted["state_dict"]) == 0.0


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", STRATEGIES)
def test_consolidate_gives_the_trained_weights(resumed: Path, tmp_path: Path, name: str) -> None:
    # last.ckpt was saved at the end of the resumed run, whose weights are the uninterrupted run's.
    expected = torch.load(resumed / f"resume-{name}.pt", weights_only=False)["uninterrupted"]["state_dict"]
    out = tmp_path / "model.safetensors"
    consolidate(resumed / f"ckpt-{name}" / "last.ckpt", out)
    written = load_file(out)
    assert written.keys() == expected.keys()
    assert max_difference(written, expected) == 0.0


@pytest.mark.multiprocess
def test_consolidate_command_writes_a_weights_only_torch_file_in_bf16(resumed: Path, tmp_path: Path) -> None:
    out = tmp_path / "model.pt"
    assert main(["consolidate", str(resumed / "ckpt-zero3" / "last.ckpt"), str(out), "--dtype", "bf16"]) == 0
    written = torch.load(out, weights_only=True)
    expected = torch.load(resumed / "resume-zero3.pt", weights_only=False)["uninterrupted"]["state_dict"]
    assert {tensor.dtype for tensor in written.values()} == {torch.bfloat16}
    assert max_difference(written, {key: value.bfloat16() for key, value in expected.items()}) == 0.0


FRESH_INTERPRETER = """
import sys, torch
from transformers import AutoModelForCausalLM
ids = torch.load(sys.argv[1])
for export in sys.argv[2:]:
    with torch.no_grad():
        torch.save(AutoModelForCausalLM.from_pretrained(export)(ids).logits, export + "/logits.pt")
assert not [name for name in sys.modules if name.startswith("lightning_zero")]
"""
#: Every source kind that records a Hugging Face model (plain ``ddp`` does not).
EXPORTED = [name for name in STRATEGIES if name != "ddp"]
#: Logits of the export in a fresh interpreter against the trained module's in this one: the same weights and fp32
#: operations, but kernels chosen per process (thread count, AMX/AVX-512 paths) sum in other orders (measured: 2.2e-6
#: on an AMX CPU). Noise of std 1e-3 on one layer's weights moves them by 4e-3, 40 times the tolerance.
LOGITS_TOLERANCE = 1e-4


@pytest.mark.multiprocess
def test_hf_dir_loads_with_from_pretrained_in_a_fresh_interpreter_with_the_same_logits(
    resumed: Path, tmp_path: Path
) -> None:
    exports = [tmp_path / name for name in EXPORTED]
    for name, export in zip(EXPORTED, exports, strict=True):
        consolidate(resumed / f"ckpt-{name}" / "last.ckpt", hf_dir=export)
        assert (export / "config.json").is_file() and list(export.glob("*.safetensors"))
    ids = torch.arange(32).reshape(2, 16) % 96
    torch.save(ids, tmp_path / "ids.pt")
    command = [sys.executable, "-c", FRESH_INTERPRETER, str(tmp_path / "ids.pt"), *map(str, exports)]
    subprocess.run(command, cwd=tmp_path, check=True, timeout=120)
    for name, export in zip(EXPORTED, exports, strict=True):
        trained = DropoutLM().eval()
        trained.load_state_dict(
            torch.load(resumed / f"resume-{name}.pt", weights_only=False)["uninterrupted"]["state_dict"]
        )
        with torch.no_grad():
            expected = trained.model(ids).logits
        torch.testing.assert_close(torch.load(export / "logits.pt"), expected, atol=LOGITS_TOLERANCE, rtol=0)


@pytest.mark.multiprocess
def test_save_top_k_prunes_sharded_directories(resumed: Path) -> None:
    assert sorted(path.name for path in (resumed / "ckpt-prune-zero3").iterdir()) == ["epoch=0-step=6.ckpt"]


CROSS_RUNS = [
    *(f"cross:{pair}" for pair in [*CROSS, *WEIGHTS_ONLY_CROSS, ONE_CARD_CROSS]),
    f"cross-fresh-optimizer:{CROSS[1]}",
]


@pytest.fixture(scope="module")
def one_process(two_processes: Path) -> tuple[Path, dict[str, int]]:
    """Every 1-process run of the module, in one launch after the 2-process one: the cross resumes (their output
    in ``crossed.log``) and the resized resumes of the grouped sources; with the inode of each grouped source's
    universal form before this launch (a second resume must reuse it, not convert again)."""
    universal = {source: universal_of(two_processes, source).stat().st_ino for source in _sources(RESIZED)}
    runs = [*CROSS_RUNS, *(f"grouped-cross:{pair}" for pair in RESIZED)]
    arguments = ["--devices", "1", "--steps", str(STEPS), "--every", str(EVERY), "--runs", *runs]
    launch = SharedLaunch.of(two_processes, [run_script(RUNNER, str(two_processes), *arguments, timeout=1200)])
    (two_processes / "crossed.log").write_text(launch.log(CROSS_RUNS))
    return two_processes, universal


@pytest.fixture(scope="module")
def crossed(one_process: tuple[Path, dict[str, int]]) -> Path:
    return one_process[0]


def cross_source_checkpoint(directory: Path, pair: str) -> Path:
    """The checkpoint (step 10 of its source's ``plain`` run) that the ``cross`` run of ``pair`` resumes."""
    return directory / f"ckpt-plain-{pair.split('>')[0]}" / f"epoch=1-step={2 * EVERY}.ckpt"


def cross_result(directory: Path, kind: str, pair: str) -> tuple[dict[str, Any], dict[str, Any]]:
    source = pair.split(">")[0]
    reference = torch.load(directory / f"plain-{source}.pt", weights_only=False)
    return torch.load(directory / f"{kind}-{pair.replace('>', '-to-')}.pt", weights_only=False), reference


# Two processes x 4 samples become one x 8: the same samples, summed in another order (measured: weights 7.4e-5,
# losses 9.5e-7 for all three pairs). An optimizer that restarts from zero moments moves weights by ~4e-2.
CROSS_TOLERANCE = {"loss": 1e-5, "weight": 1e-3}


@pytest.mark.multiprocess
@pytest.mark.parametrize("pair", CROSS)
def test_resume_at_another_world_size_and_stage_carries_the_optimizer_state(crossed: Path, pair: str) -> None:
    result, reference = cross_result(crossed, "cross", pair)
    losses = torch.tensor(reference["losses"][2 * EVERY :])
    torch.testing.assert_close(torch.tensor(result["losses"]), losses, atol=CROSS_TOLERANCE["loss"], rtol=0)
    assert max_difference(result["state_dict"], reference["state_dict"]) <= CROSS_TOLERANCE["weight"]


@pytest.mark.multiprocess
def test_pairs_that_carry_the_optimizer_state_do_not_warn(crossed: Path) -> None:
    assert (crossed / "crossed.log").read_text().count("without its optimizer state") == len(WEIGHTS_ONLY_CROSS) + 1
    assert not [line for pair in CROSS for line in weights_only_warnings(crossed, pair)]


@pytest.mark.multiprocess
def test_the_cross_resume_check_fails_when_optimizer_state_is_dropped(crossed: Path) -> None:
    result, reference = cross_result(crossed, "cross-fresh-optimizer", CROSS[1])
    assert max_difference(result["state_dict"], reference["state_dict"]) > 10 * CROSS_TOLERANCE["weight"]


#: ``grouped`` sources (2 processes, two parameter groups) and the ``SOURCE>TARGET`` resumes of their step-10
#: checkpoint on 2 processes (another stage, offload on either side) and on 1 process (another size too).
GROUPED_SOURCES = ["zero2", "zero3", "zero2_offload", "zero3_offload", "zero3_fsdp", "zero2_fairscale"]
SAME_SIZE = [
    "zero2>zero3",
    "zero3>zero2",
    "zero3>zero1",
    "zero3_offload>zero2_offload",
    "zero2_offload>zero3_offload",
    "zero3_fsdp>zero3",
    "zero3_fsdp>zero2",
    "zero3>zero2_fsdp",
    "zero2_fairscale>zero3",
    "zero2_fairscale>zero2_fsdp",
]
RESIZED = [
    "zero3>zero3",
    "zero3>zero2",
    "zero3_offload>zero3_offload",
    "zero3_offload>zero1",
    "zero2_offload>zero3",
    "zero3_fsdp>zero3_offload",
    "zero3>zero3_fsdp",
    "zero2_fairscale>zero2_offload",
    "zero3>zero3_offload_fsdp",
]


@pytest.fixture(scope="module")
def regrouped(two_processes: Path) -> Path:
    return two_processes


@pytest.fixture(scope="module")
def resized(one_process: tuple[Path, dict[str, int]]) -> tuple[Path, dict[str, int]]:
    """The 1-process resumes, after the 2-process ones converted every source once, and the inodes of
    :func:`one_process`."""
    return one_process


def _sources(pairs: list[str]) -> list[str]:
    return sorted({pair.split(">")[0] for pair in pairs})


def universal_of(directory: Path, source: str) -> Path:
    return directory / f"ckpt-grouped-{source}" / f"epoch=1-step={2 * EVERY}.ckpt{UNIVERSAL_SUFFIX}"


def grouped_result(directory: Path, pair: str, devices: int) -> tuple[dict[str, Any], dict[str, Any]]:
    source = pair.split(">")[0]
    reference = torch.load(directory / f"grouped-{source}.pt", weights_only=False)
    name = f"{pair.replace('>', '-to-')}-x{devices}"
    return torch.load(directory / f"grouped-cross-{name}.pt", weights_only=False), reference


# The same 2 processes and batches under another stage, with the same Adam (torch's, or DeepSpeed's CPU Adam on both
# sides): only the order of float32 sums may differ (measured: equal losses and weights for every pair here; 2.5e-8
# on a tiny DeBERTa through the CLI). Before each group got its own weight decay and its own Adam step back after
# DeepSpeed's ZeRO-3 universal load, weights ended 4.5e-3 off.
REGROUPED_TOLERANCE = 1e-6


@pytest.mark.multiprocess
@pytest.mark.parametrize("pair", SAME_SIZE)
def test_a_stage_change_resumes_every_parameter_group_exactly(regrouped: Path, pair: str) -> None:
    result, reference = grouped_result(regrouped, pair, 2)
    losses = torch.tensor(reference["losses"][2 * EVERY :])
    torch.testing.assert_close(torch.tensor(result["losses"]), losses, atol=REGROUPED_TOLERANCE, rtol=0)
    assert max_difference(result["state_dict"], reference["state_dict"]) <= REGROUPED_TOLERANCE


@pytest.mark.multiprocess
@pytest.mark.parametrize("pair", RESIZED)
def test_a_size_change_follows_the_uninterrupted_run(resized: tuple[Path, dict[str, int]], pair: str) -> None:
    result, reference = grouped_result(resized[0], pair, 1)
    losses = torch.tensor(reference["losses"][2 * EVERY :])
    torch.testing.assert_close(torch.tensor(result["losses"]), losses, atol=CROSS_TOLERANCE["loss"], rtol=0)
    assert max_difference(result["state_dict"], reference["state_dict"]) <= CROSS_TOLERANCE["weight"]


@pytest.mark.multiprocess
@pytest.mark.parametrize(("pair", "devices"), [*((pair, 2) for pair in SAME_SIZE), *((pair, 1) for pair in RESIZED)])
def test_the_loaded_optimizer_state_is_the_sources_to_the_bit(
    resized: tuple[Path, dict[str, int]], pair: str, devices: int
) -> None:
    """Every parameter's fp32 master weights and Adam moments, gathered by name on the target as training starts,
    equal the source's gathered at its save; so do each group's hyper-parameters and the step counts."""
    directory, source = resized[0], pair.split(">")[0]
    saved = torch.load(directory / f"optimizer-saved-{source}.pt", weights_only=False)
    loaded = torch.load(directory / f"optimizer-loaded-{pair.replace('>', '-to-')}-x{devices}.pt", weights_only=False)
    assert saved["tensors"].keys() == loaded["tensors"].keys()
    assert [key for key in saved["tensors"] if not torch.equal(saved["tensors"][key], loaded["tensors"][key])] == []
    assert loaded["groups"] == saved["groups"] and saved["groups"][0] != saved["groups"][1]
    assert loaded["steps"] == saved["steps"] == [2 * EVERY]


@pytest.mark.multiprocess
def test_the_universal_conversion_is_made_once_and_reused(resized: tuple[Path, dict[str, int]]) -> None:
    directory, before = resized
    assert {source: universal_of(directory, source).stat().st_ino for source in before} == before
    assert not list(directory.glob(f"ckpt-grouped-*/*{PARTIAL_SUFFIX}"))


# Weights-only: the first resumed step runs the saved weights on the same samples, so its loss equals the
# uninterrupted run's within float32 re-ordering (measured 9.5e-7; a resume that kept its own initial weights is off
# by 9.1e-2). Later steps use a fresh AdamW (its first update is about lr * sign(grad)) at the scheduled learning
# rate: measured 8.7e-3 to 1.0e-1 off a loss of ~4.4 (2.3%), allowed 5%.
WEIGHTS_ONLY_TOLERANCE = {"first_loss": 1e-5, "later_losses": 0.05}


@pytest.mark.multiprocess
@pytest.mark.parametrize("pair", WEIGHTS_ONLY_CROSS)
def test_a_pair_without_an_optimizer_route_resumes_the_saved_weights_and_position_with_one_warning(
    crossed: Path, pair: str
) -> None:
    result, reference = cross_result(crossed, "cross", pair)
    saved = 2 * EVERY
    expected = reference["losses"][saved:]
    assert result["global_step"] == STEPS and len(result["losses"]) == STEPS - saved
    assert result["lr"] == pytest.approx(reference["lr"], rel=1e-9)  # the schedule went on where it was
    assert abs(result["losses"][0] - expected[0]) <= WEIGHTS_ONLY_TOLERANCE["first_loss"]
    torch.testing.assert_close(
        torch.tensor(result["losses"][1:]),
        torch.tensor(expected[1:]),
        rtol=WEIGHTS_ONLY_TOLERANCE["later_losses"],
        atol=0,
    )
    assert len(weights_only_warnings(crossed, pair)) == 1


@pytest.mark.multiprocess
def test_a_one_card_preset_resumes_a_zero_checkpoint_weights_only_with_one_warning(crossed: Path) -> None:
    """The Trainer's one-card strategy reads a sharded ZeRO directory itself (it was a traceback on the directory),
    with no callback: it trains on to the end at the scheduled learning rate and says once what it did not carry."""
    result, reference = cross_result(crossed, "cross", ONE_CARD_CROSS)
    assert result["global_step"] == STEPS and len(result["losses"]) == STEPS - 2 * EVERY
    assert result["lr"] == pytest.approx(reference["lr"], rel=1e-9)
    assert len(weights_only_warnings(crossed, ONE_CARD_CROSS)) == 1
    # Lightning's distributed strategies shuffle a training loader (seeded); a single-device one keeps the loader's
    # own order, sequential here. The first resumed step is the saved weights on the epoch's next batch in that order.
    saved = ShortEpochLM(batch_size=8)
    saved.load_state_dict(consolidate(cross_source_checkpoint(crossed, ONE_CARD_CROSS)))
    batches = list(saved.train_dataloader())
    (batch,) = batches[2 * EVERY % len(batches)]
    with torch.no_grad():
        expected = saved(batch).item()
    assert abs(result["losses"][0] - expected) <= WEIGHTS_ONLY_TOLERANCE["first_loss"]


def weights_only_warnings(crossed: Path, pair: str) -> list[str]:
    """The lines of the cross launch's output that warn about ``pair``'s resume without its optimizer state."""
    target = pair.split(">")[1]
    path = cross_source_checkpoint(crossed, pair)
    names = {
        "ddp": "ddp",
        "zero2": "deepspeed ZeRO-2",
        "zero3": "deepspeed ZeRO-3",
        "zero2_fsdp": "fsdp2 ZeRO-2",
        "onecard_step_in_backward": "onecard",
    }
    here = f"under {names[target]} on 1 process"
    lines = (crossed / "crossed.log").read_text().splitlines()
    return [line for line in lines if "without its optimizer" in line and f"'{path}'" in line and here in line]


def manifest_of(backend: str, stage: int, world_size: int) -> Manifest:
    return Manifest("x.ckpt", 10, 1, world_size, backend, stage, "32-true", ModelSignature("TinyLM", 1, "0"))


@pytest.mark.parametrize(
    ("written", "now", "route"),
    [
        (("deepspeed", 2, 2), ("deepspeed", 2, 2), NATIVE),
        (("deepspeed", 2, 2), ("deepspeed", 2, 1), UNIVERSAL),
        (("deepspeed", 1, 2), ("deepspeed", 2, 1), UNIVERSAL),
        (("fsdp2", 3, 2), ("fsdp2", 2, 1), NATIVE),
        (("fairscale", 2, 2), ("fairscale", 1, 1), NATIVE),
        (("deepspeed", 2, 2), ("deepspeed", 3, 1), UNIVERSAL),
        (("deepspeed", 3, 2), ("deepspeed", 3, 1), UNIVERSAL),
        (("deepspeed", 3, 2), ("deepspeed", 1, 2), UNIVERSAL),
        (("fsdp2", 3, 2), ("deepspeed", 2, 1), UNIVERSAL),
        (("deepspeed", 3, 2), ("fsdp2", 3, 2), UNIVERSAL),
        (("fsdp2", 3, 2), ("ddp", 0, 1), WEIGHTS_ONLY),
        (("fairscale", 2, 2), ("deepspeed", 2, 2), UNIVERSAL),
        (("fairscale", 2, 2), ("fsdp2", 3, 1), UNIVERSAL),
        (("fairscale", 2, 2), ("ddp", 0, 2), WEIGHTS_ONLY),
    ],
)
def test_resume_route(written: tuple[str, int, int], now: tuple[str, int, int], route: str) -> None:
    assert resume_route(manifest_of(*written), *now) == route


@pytest.mark.parametrize("written", [("fairscale", 2, 2), ("fsdp2", 3, 2)])
def test_a_file_without_parameter_names_resumes_in_another_backend_weights_only_and_says_why(
    written: tuple[str, int, int],
) -> None:
    """A FairScale file saved before this release, or an FSDP2 ``checkpoint_format="full"`` file, keys its optimizer
    state by position only."""
    assert resume_route(manifest_of(*written), "deepspeed", 3, 2, by_name=False) == WEIGHTS_ONLY
    assert "does not record which parameter" in why_not_carried(manifest_of(*written), "deepspeed")


def test_nvme_offloaded_optimizer_state_is_recognised(tmp_path: Path) -> None:
    """DeepSpeed's NVMe swap files (per rank, beside the tag's shards) have no universal form: such a checkpoint
    resumes elsewhere weights-only, saying so."""
    (tmp_path / "latest").write_text("checkpoint")
    (tmp_path / "checkpoint").mkdir()
    assert not has_nvme_optimizer_state(tmp_path)
    (tmp_path / "checkpoint" / "offloaded_tensors" / "rank00").mkdir(parents=True)
    assert has_nvme_optimizer_state(tmp_path)
    assert "NVMe" in NVME_NOT_CARRIED


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    ("strategy", "says"),
    [("zero2_fsdp", "with its optimizer state, through its universal form"), ("ddp", "without its optimizer state")],
)
def test_the_cli_resumes_any_checkpoint_under_any_strategy_and_says_what_it_carries(
    resized: tuple[Path, dict[str, int]], strategy: str, says: str, tmp_path: Path
) -> None:
    """``--ckpt_path`` of a 2-process ZeRO-3 checkpoint, through the CLI in a process of its own (a run leaves its
    rendezvous port in the environment), on 1 process under another backend: it resumes, saying in one line before
    training what it carries."""
    checkpoint = resized[0] / "ckpt-grouped-zero3" / f"epoch=1-step={2 * EVERY}.ckpt"
    config = ["--config", "tests/data/cli_tiny.yaml", "--model.class_path", "tests.helpers.checkpoint_run.GroupedLM"]
    trainer = ["--trainer.devices", "1", "--trainer.strategy", strategy, "--trainer.max_steps", str(2 * EVERY + 1)]
    trainer += ["--trainer.default_root_dir", str(tmp_path)]  # where the CLI writes its config.yaml
    output = run_script(REPO / "main.py", "fit", *config, *trainer, "--ckpt_path", str(checkpoint), timeout=300)
    said = [line for line in output.splitlines() if f"Resuming '{checkpoint}'" in line]
    assert len(said) == 1 and says in said[0], said
