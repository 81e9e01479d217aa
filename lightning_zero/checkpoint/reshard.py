"""Resuming at another world size, stage or backend: which path a checkpoint takes, and the universal conversion.

* FSDP2 -> FSDP2 (any world size, stage 2 <-> 3, offload or not): ``torch.distributed.checkpoint`` re-shards
  model and optimizer state by itself.
* DeepSpeed, any stage, offload or not -> any stage at another world size or stage: the checkpoint is converted
  once into DeepSpeed's universal format (``deepspeed.checkpoint.ds_to_universal``, written next to it as
  ``X.universal``) and loaded with ``load_universal``; optimizer state included. DeepSpeed 0.19's converter writes
  what the reader of the source's own stage family reads; what the other family reads is added
  (:func:`_add_stage3_reader_files` for a ZeRO-1/2 source, :func:`_add_stage12_reader_files` for a ZeRO-3 one), so
  one converted folder serves every target. After the load, the slips of DeepSpeed's loaders are undone
  (:func:`repair_universal_load`).
* FSDP2 (sharded) or FairScale (a file recording its parameter names) -> DeepSpeed or FSDP2, and DeepSpeed -> FSDP2:
  the optimizer state by parameter name, through the same universal form (:mod:`~lightning_zero.checkpoint.by_name`).
* Anything else (a plain Lightning strategy, NVMe optimizer offload on either side, a file without parameter names)
  resumes from the consolidated weights and the loop position with a fresh optimizer, and warns once, saying why
  (``weights_only``).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_zero.checkpoint.atomic import fsync_tree, partial_path, publish, remove_path
from lightning_zero.checkpoint.by_name import records_parameter_names, write_universal
from lightning_zero.checkpoint.manifest import Manifest, checkpoint_manifest
from lightning_zero.checkpoint.validate import DCP_METADATA

NATIVE = "native"
UNIVERSAL = "universal"
WEIGHTS_ONLY = "weights-only"
UNIVERSAL_SUFFIX = ".universal"


def resume_route(manifest: Manifest | None, backend: str, stage: int, world_size: int, by_name: bool = True) -> str:
    """:data:`NATIVE`, :data:`UNIVERSAL` or :data:`WEIGHTS_ONLY` for resuming ``manifest``'s checkpoint here
    (``by_name``: its optimizer state can be read by parameter name: a sharded directory, or a FairScale file that
    records the names of its optimizer's positions)."""
    if manifest is None or (manifest.backend, manifest.stage, manifest.world_size) == (backend, stage, world_size):
        return NATIVE
    if manifest.backend == backend:
        # FSDP2 re-shards through DCP; FairScale and DDP files hold the whole state
        return UNIVERSAL if backend == "deepspeed" else NATIVE
    if manifest.backend in ("deepspeed", "fsdp2", "fairscale") and backend in ("deepspeed", "fsdp2") and by_name:
        return UNIVERSAL
    return WEIGHTS_ONLY


NVME_NOT_CARRIED = (
    "DeepSpeed keeps an NVMe-offloaded optimizer's state in per-rank swap files, which its universal checkpoint"
    " neither reads nor writes"
)


def has_nvme_optimizer_state(path: Path) -> bool:
    """Whether the DeepSpeed checkpoint directory ``path`` holds NVMe-offloaded optimizer state (swap files)."""
    tag_file = path / "latest"
    return tag_file.is_file() and (path / tag_file.read_text().strip() / "offloaded_tensors").is_dir()


def why_not_carried(manifest: Manifest | None, backend: str) -> str:
    """Why the optimizer state of a :data:`WEIGHTS_ONLY` resume is not carried."""
    if manifest is not None and manifest.backend in ("fairscale", "fsdp2") and backend in ("deepspeed", "fsdp2"):
        return (
            f"this {manifest.backend} file does not record which parameter each optimizer entry belongs to (FairScale"
            " checkpoints saved by this release do; FSDP2 ones when sharded, the default checkpoint_format)"
        )
    written = "a checkpoint of unknown origin" if manifest is None else manifest.backend
    return f"{written} and {backend} keep optimizer state in layouts that no maintained converter maps"


@dataclass(frozen=True)
class Route:
    """How a checkpoint resumes here: :data:`NATIVE`, :data:`UNIVERSAL` or :data:`WEIGHTS_ONLY`, and for
    :data:`WEIGHTS_ONLY` why the optimizer state is not carried."""

    name: str
    why: str = ""


def choose_route(
    path: Path,
    manifest: Manifest | None,
    backend: str,
    stage: int,
    world_size: int,
    swaps_to_nvme: Callable[[], bool],
) -> Route:
    """The route of the checkpoint ``path`` (written as ``manifest`` says) into ``backend`` at ``stage`` on
    ``world_size`` processes (``swaps_to_nvme()``: whether this run keeps its optimizer state in NVMe swap files,
    asked only of a universal route); the Trainer's strategies and Fabric's take the same one."""
    by_name = path.is_dir() or records_parameter_names(path)
    route = resume_route(manifest, backend, stage, world_size, by_name=by_name)
    if route == WEIGHTS_ONLY:
        return Route(WEIGHTS_ONLY, why_not_carried(manifest, backend))
    if route == UNIVERSAL and (has_nvme_optimizer_state(path) or swaps_to_nvme()):
        return Route(WEIGHTS_ONLY, NVME_NOT_CARRIED)
    return Route(route)


def universal_form(path: Path, is_global_zero: bool, barrier: Callable[[], None]) -> Path:
    """The universal form of ``path``, converted on global rank 0 (once: a later resume finds it) while the other
    ranks wait at ``barrier``; collective."""
    if is_global_zero:
        universal_checkpoint(path)
    barrier()
    return path.with_name(path.name + UNIVERSAL_SUFFIX)


def universal_checkpoint(path: Path) -> Path:
    """DeepSpeed's universal form of the DeepSpeed or sharded FSDP2 checkpoint directory ``path``, converted once
    into ``X.universal`` (written as ``X.universal.partial``, published when complete, reused by later resumes)."""
    target = path.with_name(path.name + UNIVERSAL_SUFFIX)
    if (target / "latest_universal").is_file():
        return target
    partial = partial_path(target)
    remove_path(partial)
    partial.mkdir(parents=True)
    if path.is_file() or (path / DCP_METADATA).is_file():
        manifest = checkpoint_manifest(path)
        write_universal(path, partial, 1 if manifest is None else manifest.world_size)
    else:
        _convert_deepspeed(path, partial)
    fsync_tree(partial)
    publish(partial, target)
    return target


def _convert_deepspeed(path: Path, partial: Path) -> None:
    """DeepSpeed's own conversion, plus what the loaders of the other stage family read."""
    from deepspeed.checkpoint import ds_to_universal

    tag = (path / "latest").read_text().strip()
    options = argparse.Namespace(
        input_folder=str(path / tag),
        output_folder=str(partial / tag),
        num_extract_workers=1,
        num_merge_workers=1,
        keep_temp_folder=False,
        strict=True,
        inject_missing_state=True,
    )
    ds_to_universal.main(options)
    if _is_stage3(path / tag):
        _add_stage12_reader_files(path / tag, partial / tag)
    else:
        _add_stage3_reader_files(partial / tag)
    for name in ("latest", "latest_universal"):
        (partial / name).write_text(tag)


def _add_stage3_reader_files(tag_folder: Path) -> None:
    """What DeepSpeed's ZeRO-3 universal loader reads and its converter does not write for a ZeRO-1/2 source: the
    model states under ZeRO-3's file name, and the optimizer's step and hyper-parameters under
    ``optimizer_state_dict`` (the per-parameter weights and moments are there already)."""
    import torch

    for model_states in list(tag_folder.glob("mp_rank_*_model_states.pt")):
        os.link(model_states, tag_folder / f"zero_pp_rank_0_{model_states.name}")
    folder = tag_folder / "zero"
    path = folder / "optimizer_state.pt"
    state = torch.load(path, weights_only=False)  # DeepSpeed's own file: it pickles its loss scaler
    step = next(iter(sorted(folder.glob("*/step.pt"))))
    state["optimizer_state_dict"] = {
        "state": {0: {"step": torch.load(step, weights_only=True)}},
        "param_groups": state["param_groups"],
    }
    torch.save(state, path)


_STAGE3_MODEL_STATES = "zero_pp_rank_*_mp_rank_*_model_states.pt"
_HP_KEYS = ("fp32", "exp_avg", "exp_avg_sq")


def _is_stage3(tag_folder: Path) -> bool:
    """Whether a DeepSpeed checkpoint folder was written by ZeRO-3 (each rank writes its own model states)."""
    return any(tag_folder.glob(_STAGE3_MODEL_STATES))


def _add_stage12_reader_files(source: Path, tag_folder: Path) -> None:
    """What DeepSpeed's ZeRO-1/2 universal loader reads and its converter does not write for a ZeRO-3 source: the
    model states under ZeRO-1/2's file name (a universal load takes the weights from ``zero/``, the rest from there),
    each parameter's states as ``{"param": tensor}`` in its full shape with a ``step.pt`` beside them, and the
    DeepSpeed version in the optimizer's common state (the ZeRO-3 loader reads both forms)."""
    import torch
    from deepspeed.checkpoint.constants import DS_VERSION, OPTIMIZER_STATE_DICT, PARAM, PARAM_SHAPES

    model_states = sorted(tag_folder.glob(_STAGE3_MODEL_STATES))[0]
    states = torch.load(model_states, map_location="cpu", weights_only=False)  # DeepSpeed's own file
    os.link(model_states, tag_folder / model_states.name.removeprefix("zero_pp_rank_0_"))
    folder = tag_folder / "zero"
    common = torch.load(folder / "optimizer_state.pt", weights_only=False)
    optimizer_file = next(iter(sorted(source.glob("*zero_pp_rank_0_*optim_states.pt"))))
    common[DS_VERSION] = torch.load(optimizer_file, map_location="cpu", weights_only=False)[DS_VERSION]
    torch.save(common, folder / "optimizer_state.pt")
    step = common[OPTIMIZER_STATE_DICT]["state"][0]["step"]
    shapes = {name: shape for group in states[PARAM_SHAPES] for name, shape in group.items()}
    for name, shape in shapes.items():
        for key in _HP_KEYS:
            tensor = torch.load(folder / name / f"{key}.pt", weights_only=True)
            torch.save({PARAM: tensor.view(shape)}, folder / name / f"{key}.pt")
        torch.save(step, folder / name / "step.pt")


def repair_universal_load(optimizer: Any, universal: Path, stage: int) -> None:
    """After DeepSpeed loaded ``universal`` into ``optimizer`` (the torch optimizer its ZeRO optimizer wraps), undo
    its loaders' slips: under ZeRO-3 each parameter group gets its own hyper-parameters back
    (:func:`_restore_group_hyper_parameters`); and each state gets an Adam ``step`` of its own (the ZeRO-3 loader
    shares one tensor, which torch's Adam then advances once per sub-group at each step: bias correction of step 6
    after 5) in the type this optimizer counts in (a tensor for torch's Adam, an integer for DeepSpeed's CPU Adam;
    the source may have used the other)."""
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    if stage == 3:
        _restore_group_hyper_parameters(optimizer, universal)
    counts_in_int = isinstance(optimizer, DeepSpeedCPUAdam)
    for state in optimizer.state.values():
        if "step" in state:
            step = float(state["step"])
            state["step"] = int(step) if counts_in_int else _tensor(step)


def _tensor(value: float) -> Any:
    import torch

    return torch.tensor(value, dtype=torch.float32)


def _restore_group_hyper_parameters(optimizer: Any, universal: Path) -> None:
    """Give each parameter group its own hyper-parameters back: DeepSpeed 0.19's ZeRO-3 universal loader gives every
    group the first group's, so parameters without weight decay get it (deepspeedai/DeepSpeed#7585 handles several
    groups in the converter only). Groups are in the order the module's ``configure_optimizers`` made them, as in
    the source."""
    import torch

    tag = (universal / "latest_universal").read_text().strip()
    saved = torch.load(universal / tag / "zero" / "optimizer_state.pt", weights_only=False)["param_groups"]
    groups = optimizer.param_groups
    if len(saved) != len(groups):
        raise ValueError(f"the checkpoint has {len(saved)} parameter groups, this optimizer {len(groups)}")
    for group, saved_group in zip(groups, saved, strict=True):
        group.update({key: value for key, value in saved_group.items() if key != "params"})
