"""FairScale ZeRO-1 (OSS + DDP) and ZeRO-2 (OSS + ShardedDataParallel): config, parity, sharding, checkpoints.

Real CPU (gloo) runs: one 2-process launch trains every case (see helpers/backend_runs.py), then one 1-process
launch resumes the 2-process checkpoints.

Tolerances (measured over 12 steps of the tiny GPT-2, 2 processes):
* parity with DDP, resume at the same world size, bf16, the GAN: bit-identical (OSS steps the same torch AdamW on
  the same averaged gradients; ShardedDataParallel reduces the same sums). We allow float32 round-off only: 1e-6.
* gradient clipping: OSS sums the squared norms rank by rank, a different order than ``clip_grad_norm_``; measured
  loss 4.8e-7, weights 6.8e-5 (Adam turns a 1e-7 change of the clip factor into up to lr-sized steps on elements
  with tiny gradients). Allowed: 1e-5 and 1e-3. Clipping itself moves losses by 2.4e-2, and clipping each rank by
  its own shard's norm (the bug this guards) by 3.2e-3.
* resuming a 2-process checkpoint in 1 process (batch 8 = the two processes' 2 x 4 samples): gradients are averaged
  in another order; measured loss 9.5e-7, weights 3.7e-5. Allowed: 1e-5 and 1e-3, far below what a lost or
  partial optimizer state does (Adam restarting moves every weight by about lr = 1e-2 in one step).
* ``compile_blocks`` with activation checkpointing: inductor's fused kernels round float32 differently from eager;
  measured loss 2.4e-6, weights 3.4e-4. Allowed: 1e-5 and 1e-3, and the weights must differ from DDP's (the
  compiled code ran).
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning as L
import pytest
import torch

from lightning_zero.errors import ZeroConfigError
from lightning_zero.presets import build_preset
from lightning_zero.strategies.fairscale import FAIRSCALE_MISSING, FairScaleStrategy, to_oss
from lightning_zero.strategies.fairscale_config import (
    DEFAULT_REDUCE_BUFFER_SIZE,
    FairScaleZeroConfig,
    optimizer_constructor_defaults,
    sharded_ddp_options,
)
from tests.helpers.backend_runs import result_name
from tests.helpers.launch import run_script
from tests.helpers.parity import assert_same_training, load_result, max_weight_difference
from tests.helpers.runif import RunIf
from tests.helpers.shared_launch import STEPS, SharedLaunch

RUNNER = Path(__file__).parent / "helpers" / "backend_runs.py"
PRESETS = ["zero1_fairscale", "zero2_fairscale"]
GAN = {"zero1_fairscale+find_unused_parameters=true": "ddp_find_unused_parameters_true", "zero2_fairscale": None}
EXACT = {"loss": 1e-6, "weight": 1e-6}
REORDERED = {"loss": 1e-5, "weight": 1e-3}
COMPILED = "train:zero2_fairscale+activation_checkpointing=true+compile_blocks=true"
needs_fairscale = RunIf(fairscale=True)

BACKEND_RUNS = [
    "train:ddp",
    *(f"train:{name}" for name in PRESETS),
    "train-bf16:ddp",
    *(f"train-bf16:{name}" for name in PRESETS),
    "train-clip:ddp",
    *(f"train-clip:{name}" for name in PRESETS),
    "train:zero2_fairscale+activation_checkpointing=true",
    COMPILED,
    *(f"resume:{name}" for name in PRESETS),
    "gan:ddp_find_unused_parameters_true",
    *(f"gan:{spec}" for spec in GAN),
]


#: 1-process resumes of checkpoints the 2-process runs saved.
BACKEND_LOADS = [f"load:{name}" for name in PRESETS]


@pytest.fixture(scope="module")
def runs(backend_launch: SharedLaunch) -> SimpleNamespace:
    """Results of this module's runs, and the output of its 2-process runs (shared with other modules' launches:
    tests/conftest.py)."""
    return SimpleNamespace(out=backend_launch.out, log=backend_launch.log(BACKEND_RUNS))


def load(runs: SimpleNamespace, run: str) -> dict:
    return load_result(runs.out, run)


# --- 2-process runs ---------------------------------------------------------------------------------------------


@pytest.mark.multiprocess
@needs_fairscale
@pytest.mark.parametrize("name", ["ddp", *PRESETS])
def test_a_finished_run_lets_its_model_be_freed(runs: SimpleNamespace, name: str) -> None:
    assert load(runs, f"train:{name}")["module_freed"]  # nothing holds it once the Trainer is dropped


@pytest.mark.multiprocess
@needs_fairscale
@pytest.mark.parametrize("name", PRESETS)
def test_matches_ddp(runs: SimpleNamespace, name: str) -> None:
    assert_same_training(load(runs, f"train:{name}"), load(runs, "train:ddp"), EXACT)
    assert load(runs, f"train:{name}")["losses"][-1] < load(runs, "train:ddp")["losses"][0] - 0.05, "did not train"


@pytest.mark.multiprocess
@needs_fairscale
@pytest.mark.parametrize("name", PRESETS)
def test_matches_ddp_in_bf16(runs: SimpleNamespace, name: str) -> None:
    bf16 = load(runs, f"train-bf16:{name}")
    assert_same_training(bf16, load(runs, "train-bf16:ddp"), EXACT)
    assert bf16["losses"] != load(runs, f"train:{name}")["losses"], "bf16-mixed changed nothing"


@pytest.mark.multiprocess
@needs_fairscale
@pytest.mark.parametrize("name", PRESETS)
def test_clips_by_the_norm_over_all_shards(runs: SimpleNamespace, name: str) -> None:
    clipped = load(runs, f"train-clip:{name}")
    assert_same_training(clipped, load(runs, "train-clip:ddp"), REORDERED)
    assert abs(clipped["losses"][-1] - load(runs, f"train:{name}")["losses"][-1]) > 1e-3, "clipping did not act"


@pytest.mark.multiprocess
@needs_fairscale
def test_activation_checkpointing_trains_the_same(runs: SimpleNamespace) -> None:
    assert "Activation checkpointing on 2 transformer blocks." in runs.log
    result = load(runs, "train:zero2_fairscale+activation_checkpointing=true")
    assert_same_training(result, load(runs, "train:ddp"), EXACT)


@pytest.mark.multiprocess
@needs_fairscale
def test_compiled_checkpointed_blocks_train_like_ddp(runs: SimpleNamespace) -> None:
    assert "torch.compile on 2 transformer blocks." in runs.log
    compiled, reference = load(runs, COMPILED), load(runs, "train:ddp")
    assert_same_training(compiled, reference, REORDERED)
    # Not bit-identical: inductor's fused kernels round differently, so the compiled code is what ran.
    assert max_weight_difference(compiled["state_dict"], reference["state_dict"]) > 0


@pytest.mark.multiprocess
@needs_fairscale
@pytest.mark.parametrize("name", PRESETS)
def test_optimizer_state_is_sharded(runs: SimpleNamespace, name: str) -> None:
    ddp_ranks = load(runs, "train:ddp")["footprints"]
    ranks = load(runs, f"train:{name}")["footprints"]
    full_state = ddp_ranks[0][2]
    assert full_state == 2 * ddp_ranks[0][1]  # Adam's two moments of every parameter
    assert sum(state for _, _, state in ranks) == full_state  # every moment held exactly once
    for local, full, state in ranks:
        assert local == full  # ZeRO-1/2 keep all parameters on every rank
        assert state < 0.6 * full_state  # OSS splits by whole tensors: about half each


@pytest.mark.multiprocess
@needs_fairscale
@pytest.mark.parametrize("name", PRESETS)
def test_resumed_run_equals_the_uninterrupted_one(runs: SimpleNamespace, name: str) -> None:
    result = load(runs, f"resume:{name}")
    resumed = result["resumed"]
    assert len(resumed["losses"]) == STEPS // 2
    assert_same_training(resumed, {**result, "losses": result["losses"][STEPS // 2 :]}, EXACT)


@pytest.mark.multiprocess
@needs_fairscale
@pytest.mark.parametrize("name", PRESETS)
def test_checkpoint_is_one_file_with_the_whole_optimizer_state(runs: SimpleNamespace, name: str) -> None:
    path = runs.out / f"ckpt-{result_name(name)}" / f"at-step-{STEPS // 2}.ckpt"
    assert path.is_file()
    checkpoint = torch.load(path, weights_only=False)
    (optimizer_state,) = checkpoint["optimizer_states"]
    parameters = sum(len(group["params"]) for group in optimizer_state["param_groups"])
    assert len(optimizer_state["state"]) == parameters  # both ranks' shards, consolidated on rank 0


@pytest.mark.multiprocess
@needs_fairscale
@pytest.mark.parametrize("name", PRESETS)
def test_two_process_checkpoint_resumes_in_one_process(runs: SimpleNamespace, name: str) -> None:
    one_process = load(runs, f"load:{name}")
    assert one_process["footprints"] == [[29056, 29056, 58112]]  # all state on the single rank
    uninterrupted = load(runs, f"resume:{name}")
    assert_same_training(one_process, {**uninterrupted, "losses": uninterrupted["losses"][STEPS // 2 :]}, REORDERED)


@pytest.mark.multiprocess
@needs_fairscale
@pytest.mark.parametrize("spec", GAN)
def test_two_optimizers_with_manual_optimization_match_ddp(runs: SimpleNamespace, spec: str) -> None:
    result, reference = load(runs, f"gan:{spec}"), load(runs, "gan:ddp_find_unused_parameters_true")
    assert len(result["losses"]) == STEPS // 2  # manual optimization: two optimizer steps a batch
    assert_same_training(result, reference, EXACT)
    assert result["losses"][0] != result["losses"][-1]


# --- configuration, in-process --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"stage": 3}, "FairScale runs ZeRO stages 1 and 2, got stage 3"),
        ({"stage": 0}, "FairScale runs ZeRO stages 1 and 2, got stage 0"),
        ({"offload_optimizer": "cpu"}, "FairScale does not support `offload_optimizer: cpu`"),
        ({"offload_optimizer": "nvme"}, "FairScale does not support `offload_optimizer: nvme`"),
        ({"stage": 3, "offload_parameters": "cpu"}, "FairScale runs ZeRO stages 1 and 2"),
        ({"stage": 1, "reduce_buffer_size": 1024}, "`reduce_buffer_size` sets ShardedDataParallel's buckets"),
        ({"nvme_path": "/tmp"}, "Unknown FairScaleZeroConfig key(s) ['nvme_path']"),
    ],
)
def test_unsupported_fields_are_one_line_errors(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ZeroConfigError) as error:
        FairScaleZeroConfig.from_dict(fields)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


@needs_fairscale
def test_presets_pick_the_stage_and_reject_bad_overrides() -> None:
    assert build_preset("zero1_fairscale").zero.stage == 1
    assert build_preset("zero2_fairscale").zero == FairScaleZeroConfig(stage=2)
    with pytest.raises(ZeroConfigError, match="offload_optimizer: cpu"):
        build_preset("zero2_fairscale", offload_optimizer="cpu")


def test_deepspeed_config_is_refused() -> None:
    from lightning_zero import DeepSpeedZeroConfig

    with pytest.raises(ZeroConfigError, match="takes a FairScaleZeroConfig, got a DeepSpeedZeroConfig"):
        FairScaleStrategy(zero=DeepSpeedZeroConfig())  # type: ignore[arg-type]


def test_sharded_ddp_buckets_follow_the_optimization_mode() -> None:
    config = FairScaleZeroConfig()
    assert sharded_ddp_options(config, manual_optimization=False)["reduce_buffer_size"] == DEFAULT_REDUCE_BUFFER_SIZE
    assert sharded_ddp_options(config, manual_optimization=True)["reduce_buffer_size"] == 0
    assert (
        sharded_ddp_options(config.replace(reduce_buffer_size=0), manual_optimization=True)["reduce_buffer_size"] == 0
    )
    with pytest.raises(ZeroConfigError, match="cannot be used with manual optimization"):
        sharded_ddp_options(config.replace(reduce_buffer_size=1024), manual_optimization=True)


def test_optimizer_is_rebuilt_from_its_constructor_arguments() -> None:
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=0.1, weight_decay=0.3)
    defaults = optimizer_constructor_defaults(torch.optim.AdamW, optimizer.defaults)
    assert "decoupled_weight_decay" in optimizer.defaults and "decoupled_weight_decay" not in defaults
    assert torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], **defaults).defaults == optimizer.defaults


@needs_fairscale
def test_an_optimizer_with_state_is_refused() -> None:
    parameter = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.Adam([parameter])
    parameter.sum().backward()
    optimizer.step()
    with pytest.raises(ZeroConfigError, match="already holds state"):
        to_oss(optimizer, FairScaleZeroConfig())


@needs_fairscale
def test_fp16_uses_fairscales_sharded_grad_scaler() -> None:
    from fairscale.optim.grad_scaler import ShardedGradScaler
    from lightning.pytorch.plugins.precision import MixedPrecision

    strategy = FairScaleStrategy(zero={"stage": 2})  # type: ignore[arg-type]
    strategy.precision_plugin = MixedPrecision("16-mixed", device="cpu")
    with pytest.warns(UserWarning, match="CUDA is not available"):  # FairScale's scaler is CUDA-only
        strategy._adapt_precision_plugin()
    assert isinstance(strategy.precision_plugin.scaler, ShardedGradScaler)


# --- FairScale missing --------------------------------------------------------------------------------------------


def test_missing_fairscale_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "fairscale", None)  # makes `import fairscale` fail
    for make in (lambda: build_preset("zero2_fairscale"), lambda: L.Trainer(strategy="zero1_fairscale")):
        with pytest.raises(ZeroConfigError) as error:
            make()
        assert str(error.value) == FAIRSCALE_MISSING
    assert "pip install 'lightning-zero[fairscale]'" in FAIRSCALE_MISSING


@pytest.mark.multiprocess
def test_package_imports_without_fairscale(tmp_path: Path) -> None:
    script = tmp_path / "no_fairscale.py"
    script.write_text(
        "import sys\n"
        "sys.modules['fairscale'] = None\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})\n"
        "import lightning_zero\n"
        "from lightning_zero.strategies import fairscale, fsdp2\n"
        "print('presets:', ' '.join(lightning_zero.preset_names()))\n"
        "try:\n"
        "    lightning_zero.build_preset('zero1_fairscale')\n"
        "except lightning_zero.ZeroConfigError as error:\n"
        "    print('error:', error)\n"
        "print('fsdp2:', type(lightning_zero.build_preset('zero3_fsdp')).__name__)\n"
    )
    output = run_script(script, timeout=120)
    assert "zero2_fairscale" in output and "zero3_fsdp" in output
    assert f"error: {FAIRSCALE_MISSING}" in output
    assert "fsdp2: FSDP2Strategy" in output


# --- GPUs ---------------------------------------------------------------------------------------------------------


@pytest.mark.multiprocess
@RunIf(min_cuda_gpus=2, fairscale=True)
def test_nccl_and_fp16_with_sharded_grad_scaler_on_two_gpus(tmp_path: Path) -> None:
    # Measured on 2 H200s: fp32 and 16-mixed (ShardedGradScaler) both bit-identical to DDP.
    gpu_runs = [f"{kind}:{name}" for kind in ("train", "train-fp16") for name in ("ddp", *PRESETS)]
    run_script(RUNNER, str(tmp_path), "--accelerator", "gpu", "--steps", str(STEPS), "--runs", *gpu_runs, timeout=600)
    gpu = SimpleNamespace(out=tmp_path, log="")
    for kind in ("train", "train-fp16"):
        for name in PRESETS:
            assert_same_training(load(gpu, f"{kind}:{name}"), load(gpu, f"{kind}:ddp"), EXACT)
    assert load(gpu, "train-fp16:ddp")["losses"] != load(gpu, "train:ddp")["losses"]
