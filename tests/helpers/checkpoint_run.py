"""Checkpoint scenarios of the tiny GPT-2 (with dropout, shuffled data) under several strategies in one launch.

    python tests/helpers/checkpoint_run.py OUT_DIR --devices 2 --runs resume:ddp resume:zero3

A run is ``KIND:STRATEGY`` (a Lightning strategy name or preset); rank 0 writes ``OUT_DIR/<kind>-<strategy>.pt``.

* ``resume``: ``--steps`` steps with ``ModelCheckpoint(every_n_train_steps=--every, save_last="link")``, the
  uninterrupted run; then a fresh module (weights perturbed) and Trainer resume with ``ckpt_path="last"`` (the
  checkpoint at the last multiple of ``--every``, mid-epoch) to ``--steps``. Saved: both runs' final state dicts,
  losses, batch fingerprints and learning rates. Checkpoints stay in ``OUT_DIR/ckpt-<strategy>``.
* ``killed``: the same first run, but during the save at step 10 rank 1 writes its pid to ``OUT_DIR/saving-pid``
  once its shards are written and then sleeps, for the test to ``kill -9`` it there (no result file).
* ``restart``: after ``killed``, the same command again with ``ckpt_path="last"``: its final state.
* ``prune``: 6 steps with a checkpoint every 2 and ``save_top_k=1``; the directory is left for the test to list.
* ``plain``: the first run of ``resume`` with the dropout-free, unshuffled ``ShortEpochLM`` (so that one process
  with twice the batch sees the same samples and numbers): its result; checkpoints in ``ckpt-plain-<strategy>``.
* ``cross``: ``SOURCE>TARGET``: after ``plain`` of SOURCE at 2 processes, ``--devices 1`` resumes its step-10
  checkpoint under TARGET with batch 8 to ``--steps`` (pairs without a route that carries the optimizer state
  resume weights-only, with one warning). ``cross-fresh-optimizer`` does the same but empties the
  optimizer state after loading (what a loader that dropped it would do), for the test to tell the two apart.
* ``grouped``: ``plain`` with :class:`GroupedLM` (two parameter groups); checkpoints in ``ckpt-grouped-<strategy>``.
  Under DeepSpeed, the optimizer state gathered at the step-10 save goes to ``optimizer-saved-<strategy>.pt``.
* ``grouped-cross``: ``SOURCE>TARGET``: after ``grouped`` of SOURCE, ``--devices`` processes resume its step-10
  checkpoint under TARGET with the source's global batch, so the run repeats SOURCE's numbers (result
  ``grouped-cross-SOURCE-to-TARGET-x<devices>.pt``); the optimizer state gathered as training starts goes to
  ``optimizer-loaded-SOURCE-to-TARGET-x<devices>.pt``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch.utils.data import DataLoader
from transformers import GPT2LMHeadModel

import lightning_zero  # noqa: F401  (registers the presets)
from lightning_zero.checkpoint import atomic
from lightning_zero.checkpoint.by_name import parameter_names
from lightning_zero.checkpoint.resume import ExactResume, WeightsOnlyResume
from tests.helpers.backend_runs import ShortEpochLM
from tests.helpers.shared_launch import announce
from tests.helpers.tiny import TinyLM, tiny_gpt2_config, token_data
from tests.helpers.trainer import end_process_group, quiet_trainer

SAMPLES = 48  # 6 steps an epoch at 2 processes x 4 samples
DROPOUT = {"resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1}


class DropoutLM(TinyLM):
    """TinyLM with dropout (so RNG states matter) and shuffled data (so the sampler's epoch matters)."""

    def __init__(self, batch_size: int = 4) -> None:
        super().__init__(batch_size=batch_size)
        config = tiny_gpt2_config()
        config.update(DROPOUT)
        torch.manual_seed(0)
        self.model = GPT2LMHeadModel(config)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(token_data(SAMPLES), batch_size=int(self.hparams["batch_size"]), shuffle=True)


def make_trainer(strategy: Any, devices: int, steps: int, callbacks: list[Any]) -> L.Trainer:
    return quiet_trainer(
        devices=devices,
        strategy=strategy,
        max_steps=steps,
        callbacks=callbacks,
        enable_checkpointing=any(isinstance(callback, ModelCheckpoint) for callback in callbacks),
    )


def checkpointing(directory: Path, every: int) -> list[Any]:
    saver = ModelCheckpoint(dirpath=directory, every_n_train_steps=every, save_top_k=-1, save_last="link")
    return [saver, ExactResume()]


def full_state(trainer: L.Trainer, module: L.LightningModule) -> dict[str, torch.Tensor]:
    gather = getattr(trainer.strategy, "full_state_dict", None)
    state = gather() if gather is not None else module.state_dict()
    return {key: value.detach().float().cpu().clone() for key, value in state.items()}


def fit(
    spec: str, devices: int, steps: int, callbacks: list[Any], ckpt_path: str | None = None
) -> tuple[L.Trainer, DropoutLM]:
    L.seed_everything(7, verbose=False)
    module = DropoutLM()
    if ckpt_path is not None:
        with torch.no_grad():  # the checkpoint must overwrite these weights
            for parameter in module.parameters():
                parameter.add_(1.0)
    trainer = make_trainer(spec, devices, steps, callbacks)
    trainer.fit(module, ckpt_path=ckpt_path)
    return trainer, module


def summary(trainer: L.Trainer, module: DropoutLM) -> dict[str, Any]:
    return {
        "state_dict": full_state(trainer, module),
        "losses": module.losses,
        "batch_fingerprints": module.batch_fingerprints,
        "lr": trainer.optimizers[0].param_groups[0]["lr"],
        "global_step": trainer.global_step,
    }


def last_lr(trainer: L.Trainer) -> float:
    return float(trainer.optimizers[0].param_groups[0]["lr"])


def resume(spec: str, args: argparse.Namespace) -> dict[str, Any] | None:
    directory = args.out / f"ckpt-{spec}"
    trainer, module = fit(spec, args.devices, args.steps, checkpointing(directory, args.every))
    uninterrupted = summary(trainer, module)
    trainer, module = fit(spec, args.devices, args.steps, checkpointing(directory, args.every), ckpt_path="last")
    resumed = summary(trainer, module)
    return {"uninterrupted": uninterrupted, "resumed": resumed} if trainer.is_global_zero else None


def killed(spec: str, args: argparse.Namespace) -> None:
    wait_in_save(args.out / "saving-pid", step=2 * args.every)
    fit(spec, args.devices, args.steps, checkpointing(args.out / f"ckpt-{spec}", args.every))


def wait_in_save(marker: Path, step: int) -> None:
    """Make rank 1 stop for good in the save at ``step``, after writing, before the checkpoint is published."""
    fsync_tree = atomic.fsync_tree

    def stalling_fsync_tree(path: Path) -> None:
        fsync_tree(path)
        if path.name.endswith(f"step={step}.ckpt{atomic.PARTIAL_SUFFIX}") and torch.distributed.get_rank() == 1:
            marker.write_text(str(os.getpid()))
            time.sleep(3600)

    atomic.fsync_tree = stalling_fsync_tree


def restart(spec: str, args: argparse.Namespace) -> dict[str, Any] | None:
    directory = args.out / f"ckpt-{spec}"
    trainer, module = fit(spec, args.devices, args.steps, checkpointing(directory, args.every), ckpt_path="last")
    result = summary(trainer, module)
    return result if trainer.is_global_zero else None


def prune(spec: str, args: argparse.Namespace) -> None:
    saver = ModelCheckpoint(dirpath=args.out / f"ckpt-prune-{spec}", every_n_train_steps=2, save_top_k=1)
    L.seed_everything(7, verbose=False)
    make_trainer(spec, args.devices, 6, [saver]).fit(DropoutLM())


def plain(spec: str, args: argparse.Namespace) -> dict[str, Any] | None:
    L.seed_everything(7, verbose=False)
    module = ShortEpochLM()
    trainer = make_trainer(spec, args.devices, args.steps, checkpointing(args.out / f"ckpt-plain-{spec}", args.every))
    trainer.fit(module)
    result = {"state_dict": full_state(trainer, module), "losses": module.losses, "lr": last_lr(trainer)}
    return result if trainer.is_global_zero else None


class _ForgetOptimizerState(Callback):
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for optimizer in trainer.optimizers:
            optimizer.state.clear()


def cross(pair: str, args: argparse.Namespace, forget: bool = False) -> dict[str, Any] | None:
    source, target = pair.split(">")
    path = args.out / f"ckpt-plain-{source}" / f"epoch=1-step={2 * args.every}.ckpt"
    L.seed_everything(7, verbose=False)
    module = ShortEpochLM(batch_size=8)
    plain_lightning = [WeightsOnlyResume()] if target == "ddp" else []  # ours resume any checkpoint themselves
    callbacks = [ExactResume(), *plain_lightning, *([_ForgetOptimizerState()] if forget else [])]
    trainer = make_trainer(target, 1, args.steps, callbacks)
    trainer.fit(module, ckpt_path=str(path))
    return {
        "state_dict": full_state(trainer, module),
        "losses": module.losses,
        "global_step": trainer.global_step,
        "lr": last_lr(trainer),
    }


class GroupedLM(ShortEpochLM):
    """ShortEpochLM whose AdamW has two parameter groups, weight decay on matrices only, as the tasks' has."""

    def configure_optimizers(self) -> Any:
        matrices = [parameter for parameter in self.parameters() if parameter.dim() > 1]
        others = [parameter for parameter in self.parameters() if parameter.dim() <= 1]
        groups = [{"params": matrices, "weight_decay": 0.1}, {"params": others, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=float(self.hparams["lr"]))


HYPER_PARAMETERS = ("lr", "betas", "eps", "weight_decay")


def optimizer_snapshot(trainer: L.Trainer, module: L.LightningModule) -> dict[str, Any]:
    """Every parameter's fp32 master weights and Adam moments, gathered whole by name (collective: every rank calls
    it), each group's hyper-parameters and the step counts: through DeepSpeed's public ``safe_get_full_*``, or
    torch's ``get_optimizer_state_dict`` elsewhere (FSDP2: its parameters are the fp32 masters)."""
    if hasattr(trainer.strategy, "sharded_ddp"):
        return _fairscale_snapshot(trainer, module)
    if not hasattr(trainer.strategy, "deepspeed_engine"):
        return _torch_snapshot(trainer, module)
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state
    from deepspeed.utils.mixed_precision_linkage import lazy_init_hp_params_optimizer_state

    zero = trainer.strategy.deepspeed_engine.optimizer
    if hasattr(zero, "single_partition_of_fp32_groups"):  # ZeRO-1/2 link the moments after a step, not CPU Adam's
        for group, flat in zip(zero.bit16_groups, zero.single_partition_of_fp32_groups, strict=True):
            lazy_init_hp_params_optimizer_state(group, flat, zero.optimizer.state)
    tensors = {
        f"{name}:{key}": (
            safe_get_full_fp32_param(parameter) if key == "fp32" else safe_get_full_optimizer_state(parameter, key)
        )
        .detach()
        .float()
        .cpu()
        .clone()
        for name, parameter in module.named_parameters()
        for key in ("fp32", "exp_avg", "exp_avg_sq")
    }
    optimizer = zero.optimizer
    return {
        "tensors": tensors,
        "groups": hyper_parameters(optimizer.param_groups),
        "steps": sorted({float(state["step"]) for state in optimizer.state.values() if "step" in state}),
    }


def hyper_parameters(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each group's Adam hyper-parameters (``betas`` as a tuple: torch's state-dict helpers may hand back a list)."""
    return [{key: tuple(group[key]) if key == "betas" else group[key] for key in HYPER_PARAMETERS} for group in groups]


def _fairscale_snapshot(trainer: L.Trainer, module: L.LightningModule) -> dict[str, Any]:
    """FairScale's OSS consolidates its shards on rank 0, keyed by position in its groups: named here."""
    optimizer = trainer.strategy.optimizers[0]
    optimizer.consolidate_state_dict(recipient_rank=0)  # type: ignore[attr-defined]
    if not trainer.is_global_zero:
        return {}
    state = optimizer.state_dict()
    weights = full_state(trainer, module)
    tensors: dict[str, torch.Tensor] = {}
    for names, group in zip(parameter_names(module, optimizer), state["param_groups"], strict=True):
        for name, index in zip(names, group["params"], strict=True):
            tensors[f"{name}:fp32"] = weights[name]
            for key in ("exp_avg", "exp_avg_sq"):
                tensors[f"{name}:{key}"] = state["state"][index][key].float().clone()
    return {
        "tensors": tensors,
        "groups": hyper_parameters(state["param_groups"]),
        "steps": sorted({float(entry["step"]) for entry in state["state"].values()}),
    }


def _torch_snapshot(trainer: L.Trainer, module: L.LightningModule) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state: Any = get_optimizer_state_dict(module, trainer.optimizers[0], options=options)
    weights = full_state(trainer, module)
    if not trainer.is_global_zero:  # the full state is gathered on rank 0 only
        return {}
    tensors: dict[str, torch.Tensor] = {}
    for name, _ in module.named_parameters():
        tensors[f"{name}:fp32"] = weights[name]
        for key in ("exp_avg", "exp_avg_sq"):
            tensors[f"{name}:{key}"] = state["state"][name][key].float().clone()
    return {
        "tensors": tensors,
        "groups": hyper_parameters(state["param_groups"]),
        "steps": sorted({float(entry["step"]) for entry in state["state"].values()}),
    }


class _SnapshotOptimizer(Callback):
    """Takes :func:`optimizer_snapshot` when the step-``step`` checkpoint is saved (``step``), or when training
    starts after a resume (``step=None``); rank 0 writes it to ``out``."""

    def __init__(self, out: Path, step: int | None) -> None:
        self.out, self.step = out, step

    def _take(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        snapshot = optimizer_snapshot(trainer, module)
        if trainer.is_global_zero:
            torch.save(snapshot, self.out)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        if self.step == trainer.global_step:
            self._take(trainer, pl_module)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.step is None:
            self._take(trainer, pl_module)


def grouped(spec: str, args: argparse.Namespace) -> dict[str, Any] | None:
    L.seed_everything(7, verbose=False)
    module = GroupedLM()
    directory = args.out / f"ckpt-grouped-{spec}"
    snapshot = _SnapshotOptimizer(args.out / f"optimizer-saved-{spec}.pt", 2 * args.every)
    trainer = make_trainer(spec, args.devices, args.steps, [*checkpointing(directory, args.every), snapshot])
    trainer.fit(module)
    result = {"state_dict": full_state(trainer, module), "losses": module.losses}
    return result if trainer.is_global_zero else None


def grouped_cross(pair: str, args: argparse.Namespace) -> dict[str, Any] | None:
    """Resume ``grouped`` SOURCE's step-10 checkpoint under TARGET on ``--devices`` processes, with the global batch
    of the 2-process source (so that the same samples are trained on), snapshotting the loaded optimizer."""
    source, target = pair.split(">")
    path = args.out / f"ckpt-grouped-{source}" / f"epoch=1-step={2 * args.every}.ckpt"
    L.seed_everything(7, verbose=False)
    module = GroupedLM(batch_size=8 // args.devices)
    name = pair.replace(">", "-to-")
    loaded = _SnapshotOptimizer(args.out / f"optimizer-loaded-{name}-x{args.devices}.pt", None)
    trainer = make_trainer(target, args.devices, args.steps, [ExactResume(), loaded])
    trainer.fit(module, ckpt_path=str(path))
    result = {"state_dict": full_state(trainer, module), "losses": module.losses}
    return result if trainer.is_global_zero else None


def cross_fresh_optimizer(pair: str, args: argparse.Namespace) -> dict[str, Any] | None:
    return cross(pair, args, forget=True)


KINDS: dict[str, Callable[[str, argparse.Namespace], dict[str, Any] | None]] = {
    "resume": resume,
    "killed": killed,
    "restart": restart,
    "prune": prune,
    "plain": plain,
    "cross": cross,
    "cross-fresh-optimizer": cross_fresh_optimizer,
    "grouped": grouped,
    "grouped-cross": grouped_cross,
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--runs", nargs="+", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    for run in args.runs:
        announce(run)
        kind, spec = run.split(":", 1)
        result = KINDS[kind](spec, args)
        if result is not None:
            suffix = f"-x{args.devices}" if kind == "grouped-cross" else ""
            torch.save(result, args.out / f"{kind}-{spec.replace('>', '-to-')}{suffix}.pt")
    end_process_group()


if __name__ == "__main__":
    main()
