"""lightning-zero under Lightning Fabric: every preset by name, trained like Fabric's own DDP, checkpoints shared with
the Trainer, the memory budget and one-line errors, and no orphaned ranks.

Real 2-process CPU (gloo) runs of the tiny GPT-2 in a plain Fabric loop, every strategy and round trip in one
launch (helpers/fabric_run.py), and one 1-process launch for the resumes at another size. Tolerances are the
Trainer's parity tests' (tests/test_parity_deepspeed.py, tests/test_fairscale.py): float32 round-off (1e-6) where the
arithmetic is DDP's (FairScale's OSS steps the same AdamW on the same averaged gradients), DeepSpeed's CPU Adam's
(1e-5 on losses, 5e-4 on weights) under optimizer offload. Measured here over 8 steps: bit-identical for every preset
but the two DeepSpeed offload ones (loss 9.5e-7, weights 7.7e-5), and bit-identical for every round trip between
Fabric and the Trainer (DeepSpeed, FairScale, FSDP2; with an LR scheduler, and in bf16-mixed where the CPU has native
bf16), so those are held to 0. Resumes at another backend, stage or size take the Trainer's checkpoint tests'
tolerances for their route (tests/test_checkpoint_runs.py): measured bit-identical on 2 processes, loss 4.8e-7 and
weights 5.9e-5 on 1.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.fabric.plugins import Precision
from lightning.fabric.strategies import STRATEGY_REGISTRY

import lightning_zero
from lightning_zero import ZeroConfigError, build_fabric_preset, build_preset
from lightning_zero.app.consolidate import consolidate
from lightning_zero.checkpoint.by_name import PARAMETER_NAMES_KEY
from lightning_zero.checkpoint.reshard import NATIVE, NVME_NOT_CARRIED, UNIVERSAL, WEIGHTS_ONLY, choose_route
from lightning_zero.checkpoint.weights_only import describe
from lightning_zero.fabric.deepspeed import FabricZeroStrategy
from lightning_zero.fabric.fairscale import FabricFairScaleStrategy
from lightning_zero.fabric.fsdp2 import FabricFSDP2Strategy
from lightning_zero.hardware import detect_cpu_facts, has_native_bf16
from lightning_zero.preset_table import PRESETS
from tests.helpers.launch import (
    REPO,
    assert_a_killed_rank_ended_the_run,
    launches_side_by_side,
    run_script,
)
from tests.helpers.parity import load_result, max_weight_difference
from tests.helpers.shared_launch import split_output
from tests.helpers.tiny import TinyLM
from tests.test_checkpoint_runs import CROSS_TOLERANCE, REGROUPED_TOLERANCE, WEIGHTS_ONLY_TOLERANCE, manifest_of
from tests.test_fabric_auto import TOO_SMALL, ZERO3
from tests.test_fairscale import REORDERED
from tests.test_parity_deepspeed import CPU_ADAM, EXACT

pytestmark = pytest.mark.multiprocess  # every test here reads a 2-process Fabric launch

RUNNER = REPO / "tests" / "helpers" / "fabric_run.py"
ORPHAN = REPO / "tests" / "helpers" / "fabric_orphan_run.py"
STEPS = 8
TOLERANCES = {
    "zero1": EXACT,
    "zero2": EXACT,
    "zero2_offload": CPU_ADAM,
    "zero3": EXACT,
    "zero3_offload": CPU_ADAM,
    "zero2_fsdp": EXACT,
    "zero3_fsdp": EXACT,
    "zero3_offload_fsdp": EXACT,
    "zero1_fairscale": EXACT,
    "zero2_fairscale": EXACT,
}
#: FairScale's own loop pieces against Fabric's DDP doing the same: ``@accum`` two micro-batches a step (the first
#: inside ``fabric.no_backward_sync``), ``@clip`` ``fabric.clip_gradients`` to norm 0.5. OSS sums the squared norms
#: rank by rank, in another order than ``clip_grad_norm_``: measured loss 4.8e-7, weights 4.4e-5, allowed the
#: Trainer's FairScale clipping tolerance (tests/test_fairscale.py); clipping each rank by its own shard's norm moves
#: the loss by ~3e-3 there.
LOOP_VARIANTS = {
    "zero1_fairscale@accum": EXACT,
    "zero2_fairscale@accum": EXACT,
    "zero1_fairscale@clip": REORDERED,
    "zero2_fairscale@clip": REORDERED,
}
#: ``@full``: FSDP2's one-file checkpoints (``checkpoint_format="full"``) instead of sharded directories.
ROUND_TRIPS = ["zero2", "zero3", "zero2_fairscale", "zero3_fsdp", "zero2_fsdp", "zero3_fsdp@full"]
TRAINER_FILE_KEYS = {"state_dict", "optimizer_states", "lr_schedulers", "pytorch-lightning_version", "lightning_zero"}
#: Round trips with an LR scheduler (``@sched``), and in bf16-mixed with one (``@bf16``) where the CPU computes in
#: bf16 natively (elsewhere it is emulated, several times slower, and left out).
NATIVE_BF16 = has_native_bf16(detect_cpu_facts())
VARIANTS = ["zero2@sched", "zero3@sched", *(["zero2@bf16", "zero3@bf16"] if NATIVE_BF16 else [])]
NO_BF16 = pytest.mark.skipif(not NATIVE_BF16, reason="no native bf16 on this CPU (AVX512-BF16/AMX): emulated, slow")
CHECKED_VARIANTS = [
    pytest.param(name, marks=NO_BF16 if "bf16" in name else ())
    for name in ["zero2@sched", "zero3@sched", "zero2@bf16", "zero3@bf16"]
]
RESTAGE = "zero2:zero3"
SIDES = ("fabric", "trainer")
#: ``CKPT:B``: a checkpoint that the round trips wrote at half the run (``X-fabric``: Fabric's, ``X-trainer``: the
#: Trainer's), resumed under Fabric with preset B of another backend on the same 2 processes, on the Trainer's routes
#: (docs/checkpoints.md), each through the universal form: DeepSpeed and FairScale into FSDP2 by name (with an LR
#: scheduler too), FSDP2 into DeepSpeed.
ACROSS_BACKENDS = [
    "zero3-fabric:zero2_fsdp",
    "zero3@sched-fabric:zero2_fsdp@sched",
    "zero3_fsdp-fabric:zero2",
    "zero2_fairscale-fabric:zero2_fsdp",
    "zero3-trainer:zero2_fsdp",
]
#: The other way round: Fabric's DeepSpeed checkpoint under the Trainer's FSDP2.
TRAINER_ACROSS_BACKENDS = ["zero3-fabric:zero2_fsdp"]
#: The same checkpoints on 1 process (one launch): FSDP2 at another stage (DCP re-shards), FairScale's consolidated
#: file, DeepSpeed at another stage (universal).
RESIZED = ["zero3_fsdp-fabric:zero2_fsdp", "zero2_fairscale-fabric:zero2_fairscale", "zero3-fabric:zero2"]
#: Where no route carries the optimizer state, the resume is weights-only, with one warning saying why: a FairScale
#: file without its optimizer's parameter names (as saved before they were recorded) under FSDP2 and under DeepSpeed,
#: and a DeepSpeed checkpoint under FairScale.
WEIGHTS_ONLY_RESUMES = {
    "zero2_fairscale-fabric-nameless:zero2_fsdp": "this fairscale file does not record which parameter",
    "zero3-fabric:zero2_fairscale": "deepspeed and fairscale keep optimizer state in layouts that no maintained",
    "zero2_fairscale-fabric-nameless:zero2": "this fairscale file does not record which parameter",
}
#: The same on 1 process: a DeepSpeed checkpoint under a one-card preset.
RESIZED_WEIGHTS_ONLY = {
    "zero3-fabric:onecard_step_in_backward": "deepspeed and onecard keep optimizer state in layouts that no maintained",
}


@pytest.fixture(scope="module")
def fabric_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fabric")
    resume = [*ROUND_TRIPS, *VARIANTS]
    trained = ["ddp", *TOLERANCES, "ddp@accum", "ddp@clip", *LOOP_VARIANTS]
    args = ["--steps", str(STEPS), "--strategies", *trained, "--resume", *resume, "--restage", RESTAGE]
    args += ["--resume-under", *ACROSS_BACKENDS, *WEIGHTS_ONLY_RESUMES, "--trainer-under", *TRAINER_ACROSS_BACKENDS]
    args += ["--auto", str(ZERO3), str(TOO_SMALL)]
    log = run_script(RUNNER, str(out), *args, timeout=600)
    (out / "launch.log").write_text(log)
    return out


@pytest.fixture(scope="module")
def resized_runs(fabric_runs: Path) -> Path:
    """The 2-process launch's checkpoints resumed on 1 process, in one launch."""
    args = ["--steps", str(STEPS), "--devices", "1", "--resume-under", *RESIZED, *RESIZED_WEIGHTS_ONLY]
    (fabric_runs / "resized.log").write_text(run_script(RUNNER, str(fabric_runs), *args, timeout=300))
    return fabric_runs


def test_every_preset_is_registered_with_fabric() -> None:
    assert {preset.name for preset in PRESETS} <= set(STRATEGY_REGISTRY)
    lightning_zero.register_fabric_presets()  # again: our own entries are replaced, no warning, no error
    assert isinstance(STRATEGY_REGISTRY.get("zero3_offload"), FabricZeroStrategy)
    assert isinstance(STRATEGY_REGISTRY.get("zero3_fsdp"), FabricFSDP2Strategy)
    assert isinstance(STRATEGY_REGISTRY.get("zero2_fairscale"), FabricFairScaleStrategy)


@pytest.mark.parametrize("name", [preset.name for preset in PRESETS])
def test_a_fabric_preset_has_the_trainer_presets_settings(name: str, tmp_path: Path) -> None:
    overrides = {"nvme_path": str(tmp_path)} if "nvme" in name else {}
    fabric, trainer = build_fabric_preset(name, **overrides), build_preset(name, **overrides)
    assert dataclasses.asdict(trainer.zero).items() <= dataclasses.asdict(fabric.zero).items()  # zero_auto: one more
    if trainer.zero_backend == "deepspeed":  # the same translation: one DeepSpeed config for both
        assert fabric.settings.given == trainer.settings.given


def test_the_memory_budget_applies_under_fabric() -> None:
    strategy = build_fabric_preset("zero2", memory_budget_gib=1e-5)
    strategy.parallel_devices = [torch.device("cpu")] * 2
    strategy.precision = Precision()
    with pytest.raises(ZeroConfigError) as error:
        strategy.prepare_module(TinyLM())
    assert "\n" not in str(error.value) and "over `memory_budget_gib: 1e-05`" in str(error.value)


def test_the_memory_budget_applies_under_fabric_fairscale_before_anything_is_wrapped() -> None:
    strategy = build_fabric_preset("zero2_fairscale", memory_budget_gib=1e-5)
    strategy.parallel_devices = [torch.device("cpu")] * 2
    strategy.precision = Precision()
    module = TinyLM()
    with pytest.raises(ZeroConfigError) as error:
        strategy.setup_module_and_optimizers(module, [torch.optim.AdamW(module.parameters())])
    assert "\n" not in str(error.value) and "over `memory_budget_gib: 1e-05`" in str(error.value)


def test_a_fairscale_optimizer_set_up_apart_from_its_model_is_one_line() -> None:
    """`fabric.setup_optimizers` after `fabric.setup(model)` would step an unsharded optimizer next to a plain DDP
    model: refused, naming the joint set-up."""
    optimizer = torch.optim.AdamW(TinyLM().parameters())
    with pytest.raises(ZeroConfigError) as error:
        build_fabric_preset("zero2_fairscale").setup_optimizer(optimizer)
    assert "\n" not in str(error.value) and "`fabric.setup(model, optimizer)`" in str(error.value)


def test_a_config_change_after_building_is_an_error() -> None:
    strategy = build_fabric_preset("zero2")
    with pytest.raises(ZeroConfigError, match="cannot be changed once built"):
        strategy.config["train_micro_batch_size_per_gpu"] = 8


@pytest.mark.parametrize("name", [*TOLERANCES, *LOOP_VARIANTS])
def test_each_preset_trains_like_fabrics_ddp(fabric_runs: Path, name: str) -> None:
    _, at, variant = name.partition("@")
    reference, result = load_result(fabric_runs, f"ddp{at}{variant}"), load_result(fabric_runs, name)
    tolerance = {**TOLERANCES, **LOOP_VARIANTS}[name]
    assert len(result["losses"]) == len(reference["losses"]) == STEPS
    torch.testing.assert_close(
        torch.tensor(result["losses"]), torch.tensor(reference["losses"]), atol=tolerance["loss"], rtol=0
    )
    assert max_weight_difference(result["state_dict"], reference["state_dict"]) <= tolerance["weight"]
    assert max_weight_difference(result["state_dict"], TinyLM().state_dict()) > 1e-3, "weights did not train"


@pytest.mark.parametrize("name", [*ROUND_TRIPS, *CHECKED_VARIANTS])
@pytest.mark.parametrize("direction", ["fabric_to_trainer", "trainer_to_fabric"])
def test_a_checkpoint_resumes_across_fabric_and_the_trainer(fabric_runs: Path, name: str, direction: str) -> None:
    """Half the run under one, the other half under the other, through one checkpoint: the losses and weights of
    the uninterrupted run (Fabric's DDP, which every preset matches exactly; with a scheduler or bf16, the preset's
    own uninterrupted Fabric run with the same scheduler and precision)."""
    reference = load_result(fabric_runs, "ddp" if name in ROUND_TRIPS else name)
    result = load_result(fabric_runs, f"{name}-{direction}")
    assert result["losses"] == reference["losses"]
    assert max_weight_difference(result["state_dict"], reference["state_dict"]) == 0


def resumed_under(out: Path, spec: str, devices: int, side: str = "fabric") -> tuple[dict[str, Any], dict[str, Any]]:
    """The second half of a ``CKPT:B`` resume under Fabric or the Trainer (``side``), and the uninterrupted Fabric
    run of CKPT's preset from the same step."""
    checkpoint, target = spec.split(":")
    under = target if side == "fabric" else f"trainer-{target}"
    result, reference = (
        load_result(out, f"{checkpoint}-under-{under}-x{devices}"),
        load_result(out, checkpoint.split("-")[0]),
    )
    return result, {**reference, "losses": reference["losses"][STEPS // 2 :]}


def resume_lines(out: Path, spec: str, devices: int, side: str = "fabric") -> list[str]:
    """The lines in which the resume of ``spec`` under Fabric or the Trainer says what it carries."""
    checkpoint, target = spec.split(":")
    backends = {
        "zero2_fsdp": ("fsdp2", 2),
        "zero2": ("deepspeed", 2),
        "zero2_fairscale": ("fairscale", 2),
        "onecard_step_in_backward": ("onecard", 0),
    }
    backend, stage = backends[target.split("@")[0]]
    log = (out / ("launch.log" if devices == 2 else "resized.log")).read_text()
    segment = split_output(log)[1][f"{side}:{spec}"]
    here = f"under {describe(backend, stage, devices)}"
    return [line for line in segment.splitlines() if f"Resuming '{out / checkpoint}.ckpt'" in line and here in line]


def assert_follows(result: dict[str, Any], reference: dict[str, Any], tolerance: dict[str, float]) -> None:
    losses = torch.tensor(reference["losses"])
    torch.testing.assert_close(torch.tensor(result["losses"]), losses, atol=tolerance["loss"], rtol=0)
    assert max_weight_difference(result["state_dict"], reference["state_dict"]) <= tolerance["weight"]


#: The Trainer's tolerance for a change of stage or backend on the same processes (tests/test_checkpoint_runs.py).
SAME_SIZE = {"loss": REGROUPED_TOLERANCE, "weight": REGROUPED_TOLERANCE}


@pytest.mark.parametrize(
    ("side", "spec"), [*(("fabric", spec) for spec in ACROSS_BACKENDS), ("trainer", *TRAINER_ACROSS_BACKENDS)]
)
def test_a_checkpoint_resumes_at_another_backend_across_fabric_and_the_trainer_with_its_optimizer_state(
    fabric_runs: Path, side: str, spec: str
) -> None:
    """The Trainer's same-size tolerance for a change of stage or backend (1e-6); a resume without the optimizer
    state is 1e-2 off (below); one line says the state was carried."""
    assert_follows(*resumed_under(fabric_runs, spec, 2, side), SAME_SIZE)
    said = resume_lines(fabric_runs, spec, 2, side)
    assert len(said) == 1 and "with its optimizer state, through its universal form" in said[0], said


@pytest.mark.parametrize("spec", RESIZED)
def test_a_fabric_checkpoint_resumes_under_fabric_at_another_size(resized_runs: Path, spec: str) -> None:
    """2 processes x 4 samples become 1 x 8: the Trainer's size-change tolerance (losses 1e-5, weights 1e-3)."""
    assert_follows(*resumed_under(resized_runs, spec, 1), CROSS_TOLERANCE)
    resized = (resized_runs / "resized.log").read_text()
    assert resized.count("without its optimizer state") == len(RESIZED_WEIGHTS_ONLY)  # those below alone


@pytest.mark.parametrize(
    ("spec", "devices"), [*((spec, 2) for spec in WEIGHTS_ONLY_RESUMES), *((spec, 1) for spec in RESIZED_WEIGHTS_ONLY)]
)
def test_a_checkpoint_without_an_optimizer_route_resumes_under_fabric_weights_only_with_one_warning(
    resized_runs: Path, spec: str, devices: int
) -> None:
    """The Trainer's weights-only tolerances: the first loss is the saved weights' (1e-5), the later ones a fresh
    AdamW's (5%); the weights end far beyond the tolerances above (the check that they catch a dropped optimizer)."""
    result, reference = resumed_under(resized_runs, spec, devices)
    assert abs(result["losses"][0] - reference["losses"][0]) <= WEIGHTS_ONLY_TOLERANCE["first_loss"]
    later, expected = torch.tensor(result["losses"][1:]), torch.tensor(reference["losses"][1:])
    torch.testing.assert_close(later, expected, rtol=WEIGHTS_ONLY_TOLERANCE["later_losses"], atol=0)
    assert max_weight_difference(result["state_dict"], reference["state_dict"]) > 10 * CROSS_TOLERANCE["weight"]
    said = resume_lines(resized_runs, spec, devices)
    expected_why = {**WEIGHTS_ONLY_RESUMES, **RESIZED_WEIGHTS_ONLY}[spec]
    assert len(said) == 1 and f"without its optimizer state: {expected_why}" in said[0], said
    launch = (resized_runs / "launch.log").read_text()
    assert launch.count("without its optimizer state") == len(WEIGHTS_ONLY_RESUMES)


def checkpoint_of_kind(directory: Path, kind: str) -> Path:
    """An empty stand-in of a checkpoint ``kind``: a sharded ``directory`` (with DeepSpeed's NVMe swap folder:
    ``nvme directory``), or a single ``file`` (recording its optimizer's parameter names: ``named file``)."""
    path = directory / "x.ckpt"
    if kind.endswith("directory"):
        (path / "checkpoint").mkdir(parents=True)
        (path / "latest").write_text("checkpoint")
        if kind.startswith("nvme"):
            (path / "checkpoint" / "offloaded_tensors").mkdir()
    else:
        torch.save({"state_dict": {}, **({PARAMETER_NAMES_KEY: [[]]} if kind.startswith("named") else {})}, path)
    return path


@pytest.mark.parametrize(
    ("written", "kind", "here", "swaps_to_nvme", "route", "why"),
    [
        (("deepspeed", 3, 2), "directory", ("fsdp2", 2, 2), False, UNIVERSAL, ""),
        (("fsdp2", 3, 2), "directory", ("fsdp2", 2, 1), False, NATIVE, ""),
        (("fsdp2", 3, 2), "directory", ("deepspeed", 2, 2), False, UNIVERSAL, ""),
        (("fairscale", 2, 2), "named file", ("fsdp2", 2, 2), False, UNIVERSAL, ""),
        (("fairscale", 2, 2), "file", ("fsdp2", 2, 2), False, WEIGHTS_ONLY, "does not record which parameter"),
        (("fsdp2", 3, 2), "file", ("deepspeed", 2, 2), False, WEIGHTS_ONLY, "does not record which parameter"),
        (("deepspeed", 3, 2), "nvme directory", ("fsdp2", 2, 2), False, WEIGHTS_ONLY, NVME_NOT_CARRIED),
        (("deepspeed", 2, 2), "directory", ("deepspeed", 3, 2), True, WEIGHTS_ONLY, NVME_NOT_CARRIED),
    ],
)
def test_fabric_and_the_trainer_choose_a_checkpoints_route_alike(
    tmp_path: Path,
    written: tuple[str, int, int],
    kind: str,
    here: tuple[str, int, int],
    swaps_to_nvme: bool,
    route: str,
    why: str,
) -> None:
    """The one route choice of the Trainer's strategies and Fabric's (Fabric's DeepSpeed took a file without names,
    an FSDP2 ``"full"`` one, for one with them, and failed in its conversion); whether the run swaps its optimizer
    to NVMe is asked only where the route would carry it."""
    asked: list[bool] = []

    def swaps() -> bool:
        asked.append(swaps_to_nvme)
        return swaps_to_nvme

    chosen = choose_route(checkpoint_of_kind(tmp_path, kind), manifest_of(*written), *here, swaps)
    assert chosen.name == route and why in chosen.why
    assert bool(asked) == (route == UNIVERSAL or swaps_to_nvme)


@pytest.mark.parametrize("name", [*CHECKED_VARIANTS, "ddp@clip"])
def test_a_variant_trains_otherwise_than_plain_ddp(fabric_runs: Path, name: str) -> None:
    """The scheduler (and bf16), the clipping ran: a run that dropped them could not match its reference by chance."""
    ddp, variant = load_result(fabric_runs, "ddp"), load_result(fabric_runs, name)
    assert max_weight_difference(variant["state_dict"], ddp["state_dict"]) > 1e-3


@pytest.mark.parametrize("name", ["zero2_fairscale", "zero3_fsdp@full"])
def test_a_fabric_checkpoint_file_has_the_trainers_entries(fabric_runs: Path, name: str) -> None:
    """One file: the model under `state_dict`, each optimizer's whole state keyed by parameter position under
    `optimizer_states` (FairScale's consolidated OSS state, FSDP2's full state), what the Trainer's loader asks for."""
    fabric, trainer = (torch.load(fabric_runs / f"{name}-{side}.ckpt", weights_only=True) for side in SIDES)
    assert fabric.keys() >= TRAINER_FILE_KEYS and trainer.keys() >= TRAINER_FILE_KEYS
    assert fabric["state_dict"].keys() == trainer["state_dict"].keys()
    for saved in (fabric, trainer):
        (optimizer,) = saved["optimizer_states"]
        assert optimizer["state"] and all(isinstance(key, int) for key in optimizer["state"])
    assert fabric["optimizer_states"][0]["state"].keys() == trainer["optimizer_states"][0]["state"].keys()


def test_a_fabric_fsdp2_directory_has_the_trainers_entries(fabric_runs: Path) -> None:
    import torch.distributed.checkpoint as dcp

    def entries(side: str) -> set[str]:
        metadata = dcp.FileSystemReader(str(fabric_runs / f"zero3_fsdp-{side}.ckpt")).read_metadata()
        return set(metadata.state_dict_metadata)

    fabric, trainer = (entries(side) for side in SIDES)
    assert fabric == trainer and {key.split(".")[0] for key in fabric} == {"state_dict", "optimizer_0"}


@pytest.mark.parametrize("name", ["zero2_fairscale", "zero3_fsdp"])
def test_consolidate_reads_the_fabric_checkpoints_of_fairscale_and_fsdp2(fabric_runs: Path, name: str) -> None:
    saved = load_result(fabric_runs, f"{name}-half")["state_dict"]
    state = consolidate(fabric_runs / f"{name}-fabric.ckpt")
    assert state.keys() == saved.keys()
    assert max_weight_difference({key: value.detach() for key, value in state.items()}, saved) == 0


@pytest.mark.multiprocess
def test_zero_auto_trains_as_the_preset_it_chose(fabric_runs: Path) -> None:
    """The budget asks for ZeRO-3 (not the default stage 2), which the run's engine had; its losses and weights are
    that preset's, bit for bit."""
    choice = json.loads((fabric_runs / "zero_auto.json").read_text())
    assert (choice["chosen"], choice["stage"], choice["offload"]) == ("zero3", 3, "none")
    auto, chosen = load_result(fabric_runs, "zero_auto"), load_result(fabric_runs, "zero3")
    assert auto["losses"] == chosen["losses"]
    assert max_weight_difference(auto["state_dict"], chosen["state_dict"]) == 0
    assert max_weight_difference(auto["state_dict"], TinyLM().state_dict()) > 1e-3, "weights did not train"


@pytest.mark.multiprocess
def test_a_zero_auto_budget_no_layout_fits_is_the_same_line_on_every_rank_at_setup(fabric_runs: Path) -> None:
    choice = json.loads((fabric_runs / "zero_auto.json").read_text())
    assert "No DeepSpeed layout's model states fit" in choice["error"] and "\n" not in choice["error"]
    assert choice["error_lengths"] == [len(choice["error"])] * 2


KILLED = ["zero2", "zero3_fsdp", "zero2_fairscale"]


@pytest.fixture(scope="module")
def killed_launches(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, int, str]]:
    """Side by side, one Fabric launch per strategy in which rank 0 kills itself: each one's directory, status and
    output."""
    return launches_side_by_side(
        tmp_path_factory, {strategy: functools.partial(killing_rank_0_under_fabric, strategy) for strategy in KILLED}
    )


def killing_rank_0_under_fabric(strategy: str, out: Path) -> list[str]:
    return [sys.executable, str(ORPHAN), str(out), strategy]


@pytest.mark.parametrize("strategy", KILLED)
def test_when_rank_0_is_killed_under_fabric_the_other_ends_too(
    killed_launches: dict[str, tuple[Path, int, str]], strategy: str
) -> None:
    """Rank 1 is in ten minutes of work of its own when rank 0 dies: without the watchdog this fails at the
    hard timeout."""
    assert_a_killed_rank_ended_the_run(*killed_launches[strategy])


def test_the_fabric_example_fine_tunes_with_zero3_offload_and_saves_a_checkpoint(tmp_path: Path) -> None:
    example = REPO / "examples" / "fabric_finetune.py"
    output = run_script(example, "--max-steps", "3", "--limit-train", "96", timeout=600, cwd=tmp_path)
    assert "zero3_offload finished 3 steps" in output
    assert consolidate(tmp_path / "checkpoints" / "fabric_finetune.ckpt").keys()
