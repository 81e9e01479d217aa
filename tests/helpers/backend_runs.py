"""Train small models under several strategies in one launch (2 processes, or 1) and save what each produced.

    python tests/helpers/backend_runs.py OUT_DIR --devices 2 --runs train:ddp train:zero2_fsdp resume:zero3_fsdp

A run is ``KIND:STRATEGY``. STRATEGY is a Lightning strategy name or a preset with config overrides,
``zero3_fsdp+checkpoint_format=full``. Kinds (rank 0 writes ``OUT_DIR/<run>.pt``, ``:`` and ``+`` turned to ``-``):

* ``train``: the tiny GPT-2 for ``--steps`` steps: per-step losses (mean over ranks), the full final state dict,
  each rank's footprint, and whether the module was freed once the run's Trainer and module were dropped.
  ``train-bf16`` / ``train-fp16`` do the same in ``bf16-mixed`` / ``16-mixed``, and ``train-clip`` with gradient
  clipping by norm.
* ``resume``: ``--stop`` steps, a checkpoint (``OUT_DIR/ckpt-<strategy>``), then a fresh Trainer and module resume
  from it to ``--steps``; the result holds the resumed run's losses and final weights.
* ``load``: one process, the checkpoint ``ckpt-<strategy>`` written by an earlier 2-process ``resume`` run, resumed
  with twice the batch (so a step sees the same samples as the two processes did) to ``--steps``.
* ``gan``: a GAN with two optimizers under manual optimization: generator and discriminator losses.
* ``switch``: the ``zero`` mapping of ``examples/backend_switch.yaml`` given to the strategy class named by
  STRATEGY (a dotted path), trained like ``train``.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import sys
import weakref
from dataclasses import astuple
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import lightning as L
import torch
import yaml
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import lightning_zero  # noqa: F401  (registers the presets)
from lightning_zero.memory.footprint import rank_footprint
from lightning_zero.presets import build_preset, preset_names
from tests.helpers.shared_launch import announce
from tests.helpers.tiny import TinyLM, token_data
from tests.helpers.trainer import end_process_group, quiet_trainer

REPO = Path(__file__).resolve().parents[2]
SWITCH_CONFIG = REPO / "examples" / "backend_switch.yaml"
CLIP = 0.5  # below the tiny GPT-2's gradient norm (about 1.2 at the start), so clipping acts
SAMPLES = 48  # 6 steps an epoch at 2 x 4 (or 1 x 8) samples a step: a checkpoint at step 6 ends an epoch


class ShortEpochLM(TinyLM):
    """TinyLM with 48 samples, so that resuming from a checkpoint at an epoch boundary replays no data."""

    def train_dataloader(self) -> DataLoader:
        return DataLoader(token_data(SAMPLES), batch_size=int(self.hparams["batch_size"]), shuffle=False)


def result_name(run: str) -> str:
    """The file stem a run's result is saved under."""
    return run.replace(":", "-").replace("+", "-").replace("=", "-").replace(".", "_")


def make_strategy(spec: str) -> Any:
    """A strategy name Lightning knows, or a preset built with ``+field=value`` overrides (values parsed as YAML)."""
    name, *overrides = spec.split("+")
    if name not in preset_names() or not overrides:
        return spec  # resolved by Lightning's registry, where `import lightning_zero` put the presets
    fields = {key: yaml.safe_load(value) for key, value in (item.split("=", 1) for item in overrides)}
    return build_preset(name, **fields)


ACCELERATOR = "cpu"


def make_trainer(
    strategy: Any,
    devices: int,
    steps: int,
    precision: Any = "32-true",
    callbacks: list[Any] | None = None,
    clip: float | None = None,
) -> L.Trainer:
    return quiet_trainer(
        accelerator=ACCELERATOR,
        devices=devices,
        strategy=strategy,
        precision=precision,
        max_steps=steps,
        gradient_clip_val=clip,
        callbacks=callbacks,
        enable_checkpointing=any(isinstance(callback, ModelCheckpoint) for callback in callbacks or []),
    )


def summarize(trainer: L.Trainer, module: L.LightningModule, losses: Any) -> dict[str, Any] | None:
    """Losses, full state dict, every rank's footprint and whether each optimizer is fused; collective, returns a
    dict on rank 0 only."""
    footprint = torch.tensor(astuple(rank_footprint(module, trainer.optimizers)), device=trainer.strategy.root_device)
    footprints = trainer.strategy.all_gather(footprint).reshape(-1, 3).tolist()
    gather = getattr(trainer.strategy, "full_state_dict", None)
    state = gather() if gather is not None else module.state_dict()
    if not trainer.is_global_zero:
        return None
    return {
        "losses": losses,
        "state_dict": {key: value.detach().float().cpu().clone() for key, value in state.items()},
        "footprints": footprints,
        "fused": [bool(getattr(optimizer, "defaults", {}).get("fused")) for optimizer in trainer.optimizers],
    }


def train(
    spec: str, devices: int, steps: int, precision: Any = "32-true", clip: float | None = None
) -> dict[str, Any] | None:
    L.seed_everything(7)
    module = ShortEpochLM()
    trainer = make_trainer(make_strategy(spec), devices, steps, precision, clip=clip)
    trainer.fit(module)
    result = summarize(trainer, module, module.losses)
    alive = weakref.ref(module)
    del trainer, module
    gc.collect()
    return None if result is None else {**result, "module_freed": alive() is None}


def checkpoint_path(out: Path, spec: str, stop: int) -> Path:
    return out / f"ckpt-{result_name(spec)}" / f"at-step-{stop}.ckpt"


def resume(spec: str, devices: int, steps: int, stop: int, out: Path) -> dict[str, Any] | None:
    """Train to ``steps`` with a checkpoint at ``stop``; then resume from it in a new Trainer to ``steps``.

    The result holds the uninterrupted run's losses and weights, and the resumed run's under ``resumed``.
    """
    L.seed_everything(7)
    module = ShortEpochLM()
    path = checkpoint_path(out, spec, stop)
    saver = ModelCheckpoint(
        dirpath=path.parent,
        filename="at-step-{step}",
        every_n_train_steps=stop,
        save_top_k=-1,
        auto_insert_metric_name=False,
    )
    trainer = make_trainer(make_strategy(spec), devices, steps, callbacks=[saver])
    trainer.fit(module)
    uninterrupted = summarize(trainer, module, module.losses)
    resumed = continue_from(spec, path, devices, steps, batch_size=4)
    if uninterrupted is None:
        return None
    return {**uninterrupted, "resumed": resumed}


def continue_from(spec: str, path: Path, devices: int, steps: int, batch_size: int) -> dict[str, Any] | None:
    L.seed_everything(7)
    module = ShortEpochLM(batch_size=batch_size)
    with torch.no_grad():  # the checkpoint must overwrite these weights
        for parameter in module.parameters():
            parameter.add_(1.0)
    trainer = make_trainer(make_strategy(spec), devices, steps)
    trainer.fit(module, ckpt_path=path)
    return summarize(trainer, module, module.losses)


def load(spec: str, steps: int, stop: int, out: Path) -> dict[str, Any] | None:
    """One process resumes a 2-process checkpoint, with the batch the two processes took together."""
    return continue_from(spec, checkpoint_path(out, spec, stop), devices=1, steps=steps, batch_size=8)


class TinyGAN(L.LightningModule):
    """A generator and a discriminator with one optimizer each, trained with manual optimization."""

    def __init__(self, noise: int = 8, features: int = 16) -> None:
        super().__init__()
        self.automatic_optimization = False
        torch.manual_seed(0)
        self.generator = nn.Sequential(nn.Linear(noise, 32), nn.ReLU(), nn.Linear(32, features))
        self.discriminator = nn.Sequential(nn.Linear(features, 32), nn.ReLU(), nn.Linear(32, 1))
        self.losses: list[tuple[float, float]] = []

    def _step(self, optimizer: Any, loss_fn: Any) -> torch.Tensor:
        self.toggle_optimizer(optimizer)
        loss = loss_fn()
        self.manual_backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        self.untoggle_optimizer(optimizer)
        return loss.detach()

    def training_step(self, batch: Any, batch_idx: int) -> None:
        real, noise = batch
        optimizers = self.optimizers()
        assert isinstance(optimizers, list)
        g_opt, d_opt = optimizers
        fake = self.generator(noise)
        ones, zeros = real.new_ones(len(real), 1), real.new_zeros(len(real), 1)

        def generator_loss() -> torch.Tensor:
            return F.binary_cross_entropy_with_logits(self.discriminator(fake), ones)

        def discriminator_loss() -> torch.Tensor:
            on_real = F.binary_cross_entropy_with_logits(self.discriminator(real), ones)
            return on_real + F.binary_cross_entropy_with_logits(self.discriminator(fake.detach()), zeros)

        g_loss = self._step(g_opt, generator_loss)
        d_loss = self._step(d_opt, discriminator_loss)
        reduce = self.trainer.strategy.reduce
        self.losses.append(
            (float(reduce(g_loss.clone(), reduce_op="mean")), float(reduce(d_loss.clone(), reduce_op="mean")))
        )

    def configure_optimizers(self) -> Any:
        return (
            torch.optim.Adam(self.generator.parameters(), lr=2e-3, betas=(0.5, 0.999)),
            torch.optim.Adam(self.discriminator.parameters(), lr=2e-3, betas=(0.5, 0.999)),
        )

    def train_dataloader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(99)
        data = TensorDataset(torch.randn(64, 16, generator=generator) + 2.0, torch.randn(64, 8, generator=generator))
        return DataLoader(data, batch_size=4, shuffle=False)


def gan(spec: str, devices: int, steps: int) -> dict[str, Any] | None:
    L.seed_everything(7)
    module = TinyGAN()
    trainer = make_trainer(make_strategy(spec), devices, steps)
    trainer.fit(module)
    return summarize(trainer, module, module.losses)


def switch(class_path: str, devices: int, steps: int) -> dict[str, Any] | None:
    """Train with ``class_path(zero=<the YAML's zero mapping>)``: one config, any backend."""
    zero = yaml.safe_load(SWITCH_CONFIG.read_text())["zero"]
    module_name, class_name = class_path.rsplit(".", 1)
    strategy = getattr(importlib.import_module(module_name), class_name)(zero=zero)
    L.seed_everything(7)
    module = ShortEpochLM()
    trainer = make_trainer(strategy, devices, steps)
    trainer.fit(module)
    return summarize(trainer, module, module.losses)


def execute(run: str, args: argparse.Namespace) -> dict[str, Any] | None:
    kind, spec = run.split(":", 1)
    if kind == "train":
        return train(spec, args.devices, args.steps)
    if kind == "train-bf16":
        return train(spec, args.devices, args.steps, precision="bf16-mixed")
    if kind == "train-fp16":
        return train(spec, args.devices, args.steps, precision="16-mixed")
    if kind == "train-clip":
        return train(spec, args.devices, args.steps, clip=CLIP)
    if kind == "resume":
        return resume(spec, args.devices, args.steps, args.stop, args.out)
    if kind == "load":
        return load(spec, args.steps, args.stop, args.out)
    if kind == "gan":
        return gan(spec, args.devices, args.steps)
    if kind == "switch":
        return switch(spec, args.devices, args.steps)
    raise SystemExit(f"unknown run kind {kind!r} in {run!r}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--stop", type=int, default=6, help="resume: step of the checkpoint")
    parser.add_argument("--runs", nargs="+", required=True)
    parser.add_argument("--accelerator", default="cpu")
    args = parser.parse_args()
    global ACCELERATOR
    ACCELERATOR = args.accelerator
    args.out.mkdir(parents=True, exist_ok=True)
    for run in args.runs:
        announce(run)
        result = execute(run, args)
        if result is not None:
            torch.save(result, args.out / f"{result_name(run)}.pt")
    end_process_group()


if __name__ == "__main__":
    main()
