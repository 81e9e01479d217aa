"""Resuming at another world size or stage: which path a checkpoint takes, and DeepSpeed's universal conversion.

* FSDP2 -> FSDP2 (any world size, stage 2 <-> 3, offload or not): ``torch.distributed.checkpoint`` re-shards
  model and optimizer state by itself.
* DeepSpeed stage 1/2 -> stage 1/2/3 at another world size or stage: the checkpoint is converted once into
  DeepSpeed's universal format (``deepspeed.checkpoint.ds_to_universal``, written next to it as ``X.universal``)
  and loaded with ``load_universal``; optimizer state included. For a stage-3 reader, two things DeepSpeed 0.19's
  converter does not write for a stage-1/2 source are added: the model states under ZeRO-3's file name, and the
  optimizer's step and hyper-parameters under ``optimizer_state_dict``; after the load, two slips of its
  ZeRO-3 loader are undone (:func:`repair_stage3_universal_load`).
* Anything else -- a DeepSpeed stage-3 source with any change (its universal conversion is not tried here), or
  another backend -- resumes from the consolidated weights and the loop position with a fresh optimizer, and
  warns once (``weights_only``).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from lightning_zero.checkpoint.atomic import fsync_tree, partial_path, publish, remove_path
from lightning_zero.checkpoint.manifest import Manifest

NATIVE = "native"
UNIVERSAL = "universal"
WEIGHTS_ONLY = "weights-only"
UNIVERSAL_SUFFIX = ".universal"


def resume_route(manifest: Manifest | None, backend: str, stage: int, world_size: int) -> str:
    """:data:`NATIVE`, :data:`UNIVERSAL` or :data:`WEIGHTS_ONLY` for resuming ``manifest``'s checkpoint here."""
    if manifest is None or (manifest.backend, manifest.stage, manifest.world_size) == (backend, stage, world_size):
        return NATIVE
    if manifest.backend == backend and backend != "deepspeed":
        return NATIVE  # FSDP2 re-shards through DCP; FairScale and DDP files hold the whole state
    if manifest.backend == backend and manifest.stage <= 2:
        return UNIVERSAL
    return WEIGHTS_ONLY


def why_not_carried(manifest: Manifest | None, backend: str) -> str:
    """Why the optimizer state of a :data:`WEIGHTS_ONLY` resume is not carried."""
    if manifest is None or manifest.backend != backend:
        written = "a checkpoint of unknown origin" if manifest is None else manifest.backend
        return f"{written} and {backend} keep optimizer state in layouts that no maintained converter maps"
    return "a DeepSpeed ZeRO-3 checkpoint resumes at another stage or world size through no route here yet"


def universal_checkpoint(path: Path) -> Path:
    """DeepSpeed's universal form of the checkpoint directory ``path``, converted once into ``X.universal``."""
    from deepspeed.checkpoint import ds_to_universal

    target = path.with_name(path.name + UNIVERSAL_SUFFIX)
    tag = (path / "latest").read_text().strip()
    if (target / "latest_universal").is_file():
        return target
    partial = partial_path(target)
    remove_path(partial)
    partial.mkdir(parents=True)
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
    _add_stage3_reader_files(partial / tag)
    for name in ("latest", "latest_universal"):
        (partial / name).write_text(tag)
    fsync_tree(partial)
    publish(partial, target)
    return target


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


def repair_stage3_universal_load(optimizer: Any, universal: Path) -> None:
    """Undo two slips of DeepSpeed 0.19's ZeRO-3 universal loader, on ``optimizer`` (the torch optimizer it wraps).

    It gives every parameter group the first group's hyper-parameters, so parameters without weight decay get it
    (deepspeedai/DeepSpeed#7585 handles several groups in the converter only); and it gives every sub-group's state
    the same ``step`` tensor, which torch's Adam then advances once per sub-group at each step (bias correction of
    step 6 after 5). Groups are in the order the module's ``configure_optimizers`` made them, as in the source.
    """
    import torch

    tag = (universal / "latest_universal").read_text().strip()
    saved = torch.load(universal / tag / "zero" / "optimizer_state.pt", weights_only=False)["param_groups"]
    groups = optimizer.param_groups
    if len(saved) != len(groups):
        raise ValueError(f"the checkpoint has {len(saved)} parameter groups, this optimizer {len(groups)}")
    for group, saved_group in zip(groups, saved, strict=True):
        group.update({key: value for key, value in saved_group.items() if key != "params"})
    for state in optimizer.state.values():
        if isinstance(state.get("step"), torch.Tensor):
            state["step"] = state["step"].clone()
