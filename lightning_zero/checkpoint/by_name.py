"""Optimizer state by parameter name: the bridge between DeepSpeed, FSDP2 and FairScale, which shard it differently.

Once gathered, each backend's Adam state is the same per-parameter data: the fp32 master weights, the two moments
and a step count, with each parameter group's hyper-parameters. DeepSpeed's universal checkpoint stores exactly
that, one folder per parameter name, so it is the common form:

* FSDP2 -> DeepSpeed: :func:`write_universal` writes the FSDP2 checkpoint's state as a universal
  checkpoint, which DeepSpeed's own ``load_universal`` then reads at any stage and world size, as it reads a
  converted DeepSpeed source.
* DeepSpeed -> FSDP2: :func:`torch_optimizer_state` turns a universal checkpoint into the full, name-keyed state
  dict that torch's ``set_optimizer_state_dict`` shards onto the FSDP2 optimizer.
* FairScale -> either: its file holds the consolidated state keyed by position in the optimizer's groups; the
  names of those positions, recorded at the save (:data:`PARAMETER_NAMES_KEY`), make it a universal checkpoint too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

MOMENTS = ("exp_avg", "exp_avg_sq")
#: The tag under which Lightning's DeepSpeed strategy saves, used for universal folders written here.
TAG = "checkpoint"
#: Where a single-file checkpoint records the parameter name of each position in its optimizer's groups.
PARAMETER_NAMES_KEY = "lightning_zero_parameter_names"
_OPTIMIZER = "optimizer_0"  # Lightning's key of the (one) optimizer in a sharded FSDP2 checkpoint
_WEIGHTS = "state_dict"


@dataclass(frozen=True)
class NamedOptimizerState:
    """Full per-parameter optimizer state: fp32 master weights and Adam moments by parameter name, the step count,
    and each parameter group's hyper-parameters (``params`` left out), in the order the groups were made."""

    weights: dict[str, torch.Tensor]
    moments: dict[str, dict[str, torch.Tensor]]
    step: float
    groups: list[dict[str, Any]]


def read_fsdp2(path: Path) -> NamedOptimizerState:
    """The optimizer state of a sharded FSDP2 checkpoint, read whole without a process group."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = dcp.FileSystemReader(str(path))
    flat: dict[str, Any] = {}
    for key, entry in reader.read_metadata().state_dict_metadata.items():
        if isinstance(entry, TensorStorageMetadata) and key.startswith((f"{_WEIGHTS}.", f"{_OPTIMIZER}.state.")):
            flat[key] = torch.empty(entry.size, dtype=entry.properties.dtype)
        elif key.startswith(f"{_OPTIMIZER}.param_groups."):
            flat[key] = None  # a pickled value: DCP puts it here
    dcp.load(flat, storage_reader=reader, no_dist=True)
    return _named_state(flat)


def _named_state(flat: dict[str, Any]) -> NamedOptimizerState:
    moments: dict[str, dict[str, torch.Tensor]] = {}
    steps: set[float] = set()
    groups: dict[int, dict[str, Any]] = {}
    for key, value in flat.items():
        if key.startswith(f"{_OPTIMIZER}.state."):
            name, _, field = key.removeprefix(f"{_OPTIMIZER}.state.").rpartition(".")
            if field == "step":
                steps.add(float(value))
            else:
                moments.setdefault(name, {})[field] = value
        elif key.startswith(f"{_OPTIMIZER}.param_groups."):
            index, _, field = key.removeprefix(f"{_OPTIMIZER}.param_groups.").partition(".")
            if field != "params":
                groups.setdefault(int(index), {})[field] = value
    if len(steps) != 1:
        raise ValueError(f"the checkpoint's parameters were stepped different numbers of times: {sorted(steps)}")
    weights = {
        key.removeprefix(f"{_WEIGHTS}."): value.float() for key, value in flat.items() if key.startswith(f"{_WEIGHTS}.")
    }
    return NamedOptimizerState(weights, moments, steps.pop(), [groups[index] for index in sorted(groups)])


def parameter_names(module: nn.Module, optimizer: Any) -> list[list[str]]:
    """The name of each parameter of each of ``optimizer``'s groups, in order (saved as :data:`PARAMETER_NAMES_KEY`)."""
    names = {id(parameter): name for name, parameter in module.named_parameters()}
    return [[names[id(parameter)] for parameter in group["params"]] for group in optimizer.param_groups]


def read_single_file(content: dict[str, Any]) -> NamedOptimizerState:
    """The optimizer state of a single-file checkpoint (FairScale's) whose positions have recorded names."""
    optimizer = content["optimizer_states"][0]
    moments: dict[str, dict[str, torch.Tensor]] = {}
    steps: set[float] = set()
    for names, group in zip(content[PARAMETER_NAMES_KEY], optimizer["param_groups"], strict=True):
        for name, index in zip(names, group["params"], strict=True):
            entry = optimizer["state"].get(index)
            if entry:
                moments[name] = {key: entry[key] for key in MOMENTS}
                steps.add(float(entry["step"]))
    if len(steps) != 1:
        raise ValueError(f"the checkpoint's parameters were stepped different numbers of times: {sorted(steps)}")
    weights = {name: content["state_dict"][name].float() for name in moments}
    groups = [{key: value for key, value in group.items() if key != "params"} for group in optimizer["param_groups"]]
    return NamedOptimizerState(weights, moments, steps.pop(), groups)


def write_universal(source: Path, target: Path, world_size: int) -> None:
    """Write the sharded FSDP2 checkpoint or FairScale file ``source`` into ``target`` as a DeepSpeed universal
    checkpoint: each parameter's fp32 weights, moments and step, the groups' hyper-parameters, and model-state files
    holding Lightning's entries (loops, callbacks, schedulers...) that DeepSpeed hands back as its client state."""
    from lightning_zero.checkpoint.full_state import dcp_extras

    if source.is_dir():
        state, extras = read_fsdp2(source), dcp_extras(source)
    else:
        content = torch.load(source, map_location="cpu", weights_only=True, mmap=True)
        state = read_single_file(content)
        extras = {key: value for key, value in content.items() if key not in ("state_dict", "optimizer_states")}
    folder = target / TAG
    _write_parameters(state, folder / "zero")
    _write_common_state(state, folder / "zero")
    _write_model_states(extras, folder, world_size)
    for name in ("latest", "latest_universal"):
        (target / name).write_text(TAG)


def records_parameter_names(path: Path) -> bool:
    """Whether the single-file checkpoint ``path`` records its optimizer positions' names."""
    content = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    return isinstance(content, dict) and PARAMETER_NAMES_KEY in content


def _write_parameters(state: NamedOptimizerState, zero: Path) -> None:
    from deepspeed.checkpoint.constants import PARAM

    step = torch.tensor(state.step)
    for name, moments in state.moments.items():
        folder = zero / name
        folder.mkdir(parents=True)
        torch.save({PARAM: state.weights[name]}, folder / "fp32.pt")
        for key in MOMENTS:
            torch.save({PARAM: moments[key].float()}, folder / f"{key}.pt")
        torch.save(step, folder / "step.pt")


def _write_common_state(state: NamedOptimizerState, zero: Path) -> None:
    """What DeepSpeed's ZeRO-1/2 (``param_groups``, ``ds_version``) and ZeRO-3 (``optimizer_state_dict``) universal
    loaders read besides the parameters."""
    import deepspeed
    from deepspeed.checkpoint.constants import DS_VERSION, OPTIMIZER_STATE_DICT, PARAM_GROUPS

    groups = [{**group, "params": []} for group in state.groups]
    common = {
        PARAM_GROUPS: groups,
        OPTIMIZER_STATE_DICT: {"state": {0: {"step": torch.tensor(state.step)}}, PARAM_GROUPS: groups},
        DS_VERSION: deepspeed.__version__,
    }
    torch.save(common, zero / "optimizer_state.pt")


def _write_model_states(extras: dict[str, Any], folder: Path, world_size: int) -> None:
    """The model-state file of each stage family's name: what DeepSpeed's loader reads from it under
    ``load_universal`` (it takes the weights from ``zero/``), and Lightning's entries, its client state."""
    import deepspeed

    states = {
        **extras,
        "module": {},
        "dp_world_size": world_size,
        "mp_world_size": 1,
        "global_steps": int(extras.get("global_step", 0)),
        "skipped_steps": 0,
        "lr_scheduler": None,
        "ds_version": deepspeed.__version__,
    }
    torch.save(states, folder / "mp_rank_00_model_states.pt")
    torch.save(states, folder / "zero_pp_rank_0_mp_rank_00_model_states.pt")


def read_universal(universal: Path) -> NamedOptimizerState:
    """The per-parameter state of a DeepSpeed universal checkpoint (as :func:`reshard.universal_checkpoint` makes)."""
    from deepspeed.checkpoint.constants import PARAM, PARAM_GROUPS

    zero = universal / (universal / "latest_universal").read_text().strip() / "zero"
    weights: dict[str, torch.Tensor] = {}
    moments: dict[str, dict[str, torch.Tensor]] = {}
    steps: set[float] = set()
    # A folder without moments holds a weight no optimizer steps (DeepSpeed writes one for a tied weight's other name).
    for folder in sorted(path for path in zero.iterdir() if (path / f"{MOMENTS[0]}.pt").is_file()):
        files = {key: torch.load(folder / f"{key}.pt", weights_only=False) for key in ("fp32", *MOMENTS)}
        weights[folder.name] = _tensor_of(files.pop("fp32"), PARAM)
        moments[folder.name] = {key: _tensor_of(value, PARAM) for key, value in files.items()}
        steps.add(float(torch.load(folder / "step.pt", weights_only=False)))
    common = torch.load(zero / "optimizer_state.pt", weights_only=False)
    groups = [{key: value for key, value in group.items() if key != "params"} for group in common[PARAM_GROUPS]]
    if len(steps) != 1:
        raise ValueError(f"the checkpoint's parameters were stepped different numbers of times: {sorted(steps)}")
    return NamedOptimizerState(weights, moments, steps.pop(), groups)


def _tensor_of(value: Any, key: str) -> torch.Tensor:
    tensor = value[key] if isinstance(value, dict) else value
    assert isinstance(tensor, torch.Tensor)
    return tensor


def torch_optimizer_state(state: NamedOptimizerState, module: nn.Module, optimizer: Any) -> dict[str, Any]:
    """``state`` as the full optimizer state dict torch's ``set_optimizer_state_dict`` takes for ``optimizer`` over
    ``module``'s parameters (keyed by name; each group with its source group's hyper-parameters)."""
    names = {id(parameter): name for name, parameter in module.named_parameters()}
    if len(state.groups) != len(optimizer.param_groups):
        raise ValueError(
            f"the checkpoint has {len(state.groups)} parameter groups, this optimizer {len(optimizer.param_groups)}"
        )
    groups = []
    for group, saved in zip(optimizer.param_groups, state.groups, strict=True):
        hyper = {key: value for key, value in saved.items() if key in group}
        groups.append({**group, **hyper, "params": [names[id(parameter)] for parameter in group["params"]]})
    per_parameter = {
        name: {"step": torch.tensor(state.step, dtype=torch.float32), **moments}
        for name, moments in state.moments.items()
    }
    return {"state": per_parameter, "param_groups": groups}


def load_into_torch_optimizer(module: nn.Module, optimizer: Any, state: NamedOptimizerState) -> None:
    """Shard ``state`` onto ``optimizer`` (a torch optimizer over FSDP2-sharded ``module``): every rank passes the
    full state, and torch keeps each rank's shard."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    full = torch_optimizer_state(state, module, optimizer)
    set_optimizer_state_dict(module, optimizer, full, options=StateDictOptions(full_state_dict=True))
