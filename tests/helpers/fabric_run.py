"""Train the tiny GPT-2 with Lightning Fabric under several strategies in one 2-process launch.

    python tests/helpers/fabric_run.py OUT_DIR --steps 8 --strategies ddp zero2 zero3_fsdp [--resume zero2]

A plain Fabric loop (``fabric.setup``, ``fabric.backward``, ``optimizer.step``) over the data every rank's shard of
:func:`~tests.helpers.tiny.token_data`; for each strategy rank 0 writes OUT_DIR/NAME.pt with the per-step losses
(mean over ranks) and the full final state dict. Strategies share one process group (Fabric's first launch starts
rank 1; later Fabrics and Trainers of the run find the group there).

``--resume NAME`` adds, for that preset, the round trips between Fabric and the Trainer at the same size and stage:
``fabric_to_trainer`` (Fabric trains the first half, ``fabric.save``; the Trainer resumes from that directory
through ``ckpt_path`` and trains the second half) and ``trainer_to_fabric`` (the other way round, through
``trainer.save_checkpoint`` and ``fabric.load``), each saved as NAME-fabric_to_trainer.pt and so on (and the
state at the Fabric save as NAME-half.pt). ``NAME@sched`` adds an LR scheduler on both sides, ``NAME@bf16`` a
scheduler in ``bf16-mixed`` (the run of NAME@VARIANT uninterrupted under Fabric is saved too, NAME@VARIANT.pt),
``NAME@full`` saves one-file checkpoints (FSDP2's ``checkpoint_format="full"``).
``--restage A:B`` resumes a Fabric checkpoint of preset A under preset B (A-to-B.pt).
``--resume-under CKPT:B`` resumes OUT_DIR/CKPT.ckpt, which the round trips of this or an earlier launch saved at
half the steps, under Fabric with preset B on ``--devices`` processes and trains the second half
(CKPT-under-B-xN.pt, the second half's losses); ``--trainer-under CKPT:B`` the same under the Trainer on 2
processes (CKPT-under-trainer-B-x2.pt); each announced as ``fabric:CKPT:B`` or ``trainer:CKPT:B``
(:func:`~tests.helpers.shared_launch.announce`). ``CKPT-nameless`` is CKPT (a FairScale file) without the names of its
optimizer's parameters, as a FairScale file saved before they were recorded.
``--auto BUDGET TOO_SMALL`` trains ``zero_auto`` with ``memory_budget_gib=BUDGET`` (zero_auto.pt), then sets it up
with a budget no layout fits; OUT_DIR/zero_auto.json holds the layout chosen, its DeepSpeed stage and offload, and
each rank's error at ``fabric.setup`` under TOO_SMALL.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import lightning as L
import torch
from torch.utils.data import DataLoader, Subset

from lightning_zero import build_fabric_preset, build_preset  # (the import registers the presets, Fabric's too)
from lightning_zero.checkpoint.by_name import PARAMETER_NAMES_KEY
from lightning_zero.checkpoint.weights_only import WEIGHTS_ONLY_KEY
from lightning_zero.errors import ZeroConfigError
from tests.helpers.shared_launch import announce
from tests.helpers.tiny import TinyLM, token_data
from tests.helpers.trainer import end_process_group, quiet_trainer

BATCH = 4
#: The samples of one step over all ranks: ``BATCH`` on each of 2 processes, all of them on 1.
GLOBAL_BATCH = 2 * BATCH
LR = 1e-2
WEIGHT_DECAY = 0.01


@dataclass(frozen=True)
class Variant:
    """How a run trains besides its strategy: the precision, whether an LR scheduler steps each step, and fields
    of the preset's config overridden."""

    precision: Literal["32-true", "bf16-mixed"] = "32-true"
    scheduled: bool = False
    overrides: tuple[tuple[str, str], ...] = ()
    #: Micro-batches per step, all but the last backward inside ``fabric.no_backward_sync``.
    accumulate: int = 1
    #: ``fabric.clip_gradients`` to this norm before each step.
    clip: float | None = None

    @staticmethod
    def of(spec: str) -> tuple[str, Variant]:
        """``NAME`` or ``NAME@VARIANT`` (a key of :data:`VARIANTS`): the preset and its variant."""
        name, _, variant = spec.partition("@")
        return name, VARIANTS[variant]

    def strategy(self, name: str, build: Any) -> Any:
        """Preset ``name`` by name, or built by ``build`` (Fabric's or the Trainer's) with the overrides."""
        return build(name, **dict(self.overrides)) if self.overrides else name


VARIANTS = {
    "": Variant(),
    "sched": Variant(scheduled=True),
    "bf16": Variant("bf16-mixed", True),
    "full": Variant(overrides=(("checkpoint_format", "full"),)),
    "accum": Variant(accumulate=2),
    "clip": Variant(clip=0.5),  # below the tiny GPT-2's gradient norm (about 1.2 at the start), so clipping acts
}


def fabric_for(strategy: str, variant: Variant = Variant(), devices: int = 2) -> L.Fabric:
    chosen = variant.strategy(strategy, build_fabric_preset)
    fabric = L.Fabric(accelerator="cpu", devices=devices, strategy=chosen, precision=variant.precision)
    fabric.launch()
    return fabric


def schedule(optimizer: Any) -> Any:
    """TinyLM's own scheduler, the one the Trainer's side steps."""
    return torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1.0, end_factor=0.5, total_iters=20)


def samples(rank: int, first_step: int, steps: int, world_size: int = 2) -> Subset[Any]:
    """The samples ``rank`` of ``world_size`` trains on in steps ``first_step`` to ``first_step + steps``: r, r + 2,
    ... of the data, in order, on 2 processes; all of them on 1 (each step the same samples). Each rank's loader is
    its own (no distributed sampler): the Trainer's always shuffles, and the second half of a run must see the
    batches an uninterrupted run sees."""
    batch = GLOBAL_BATCH // world_size
    first = batch * first_step
    return Subset(token_data(), [world_size * index + rank for index in range(first, first + batch * steps)])


def fabric_setup(fabric: L.Fabric, variant: Variant = Variant()) -> tuple[Any, Any, Any]:
    """The model, optimizer and (for a scheduled variant) LR scheduler, set up by ``fabric``."""
    module = TinyLM(lr=LR, weight_decay=WEIGHT_DECAY, scheduler=False)
    optimizer = torch.optim.AdamW(module.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    if not variant.scheduled:
        model, optimizer = fabric.setup(module, optimizer)
        return model, optimizer, None
    return fabric.setup(module, optimizer, scheduler=schedule(optimizer))


def fabric_train(
    fabric: L.Fabric,
    model: Any,
    optimizer: Any,
    first_step: int,
    steps: int,
    scheduler: Any = None,
    variant: Variant = Variant(),
) -> list[float]:
    data = samples(fabric.global_rank, first_step, steps, fabric.world_size)
    batch = GLOBAL_BATCH // fabric.world_size
    loader = fabric.setup_dataloaders(DataLoader(data, batch_size=batch), use_distributed_sampler=False)
    losses = []
    for (input_ids,) in loader:
        micro_batches = input_ids.chunk(variant.accumulate)
        loss = torch.zeros(())
        for index, micro_batch in enumerate(micro_batches):
            with fabric.no_backward_sync(model, enabled=index < len(micro_batches) - 1):
                micro_loss = model(micro_batch) / len(micro_batches)
                fabric.backward(micro_loss)
            loss = loss + micro_loss.detach()
        if variant.clip is not None:
            fabric.clip_gradients(model, optimizer, max_norm=variant.clip)
        optimizer.step()
        optimizer.zero_grad()
        if scheduler is not None:
            scheduler.step()
        mean = fabric.all_reduce(loss, reduce_op="mean")
        assert isinstance(mean, torch.Tensor)
        losses.append(mean.item())
    return losses


def full_state(fabric: L.Fabric, model: Any) -> dict[str, torch.Tensor]:
    strategy = fabric.strategy
    if hasattr(strategy, "full_state_dict"):
        state: dict[str, torch.Tensor] = strategy.full_state_dict(model)
    else:  # Fabric's own DDP: every rank holds the whole model
        state = model.state_dict()
    return {key: value.detach().float().cpu().clone() for key, value in state.items()}


def save_result(fabric: L.Fabric, out: Path, name: str, losses: list[float], state: dict[str, Any]) -> None:
    if fabric.is_global_zero:
        torch.save({"losses": losses, "state_dict": state}, out / f"{name}.pt")
    fabric.barrier()


def fabric_run(out: Path, spec: str, steps: int) -> None:
    strategy, variant = Variant.of(spec)
    fabric = fabric_for(strategy, variant)
    model, optimizer, scheduler = fabric_setup(fabric, variant)
    losses = fabric_train(fabric, model, optimizer, 0, steps, scheduler, variant)
    save_result(fabric, out, spec, losses, full_state(fabric, model))


def zero_auto(out: Path, budget: float, too_small: float, steps: int) -> None:
    fabric = L.Fabric(accelerator="cpu", devices=2, strategy=build_fabric_preset("zero_auto", memory_budget_gib=budget))
    fabric.launch()
    model, optimizer, _ = fabric_setup(fabric)
    losses = fabric_train(fabric, model, optimizer, 0, steps)
    save_result(fabric, out, "zero_auto", losses, full_state(fabric, model))
    strategy: Any = fabric.strategy
    record = {
        "chosen": strategy.chosen.layout.name,
        "stage": strategy.zero.stage,
        "offload": strategy.zero.offload_optimizer,
    }
    too_small_strategy = build_fabric_preset("zero_auto", memory_budget_gib=too_small)
    fabric = L.Fabric(accelerator="cpu", devices=2, strategy=too_small_strategy)
    fabric.launch()
    try:
        fabric_setup(fabric)
        error = ""
    except ZeroConfigError as refused:
        error = str(refused)
    lengths = fabric.all_gather(torch.tensor([len(error)]))
    assert isinstance(lengths, torch.Tensor)
    if fabric.is_global_zero:
        record.update(error=error, error_lengths=lengths.flatten().tolist())
        (out / "zero_auto.json").write_text(json.dumps(record))
    fabric.barrier()


class TailLM(TinyLM):
    """The tiny LM on the samples of steps ``first_step`` onwards."""

    def __init__(self, first_step: int, steps: int, scheduled: bool = False) -> None:
        super().__init__(lr=LR, weight_decay=WEIGHT_DECAY, scheduler=scheduled, batch_size=BATCH)
        self.first_step, self.steps = first_step, steps

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(samples(self.global_rank, self.first_step, self.steps), batch_size=BATCH)


def trainer_for(strategy: str, variant: Variant, steps: int) -> L.Trainer:
    return quiet_trainer(
        devices=2,
        strategy=variant.strategy(strategy, build_preset),
        max_steps=steps,
        use_distributed_sampler=False,
        precision=variant.precision,
    )


def trainer_state(trainer: L.Trainer) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = trainer.strategy.full_state_dict()  # type: ignore[attr-defined]
    return {key: value.detach().float().cpu().clone() for key, value in state.items()}


def fabric_to_trainer(out: Path, spec: str, steps: int) -> None:
    strategy, variant = Variant.of(spec)
    half = steps // 2
    fabric = fabric_for(strategy, variant)
    model, optimizer, scheduler = fabric_setup(fabric, variant)
    first = fabric_train(fabric, model, optimizer, 0, half, scheduler)
    path = out / f"{spec}-fabric.ckpt"
    state = {"model": model, "optimizer": optimizer, "global_step": half}
    fabric.save(path, state if scheduler is None else {**state, "scheduler": scheduler})
    save_result(fabric, out, f"{spec}-half", first, full_state(fabric, model))
    trainer = trainer_for(strategy, variant, steps - half)
    module = TailLM(half, steps - half, variant.scheduled)
    trainer.fit(module, ckpt_path=path)
    save_result(fabric, out, f"{spec}-fabric_to_trainer", first + module.losses, trainer_state(trainer))


def trainer_to_fabric(out: Path, spec: str, steps: int) -> None:
    strategy, variant = Variant.of(spec)
    half = steps // 2
    trainer = trainer_for(strategy, variant, half)
    module = TailLM(0, half, variant.scheduled)
    trainer.fit(module)
    path = out / f"{spec}-trainer.ckpt"
    trainer.save_checkpoint(path)
    fabric = fabric_for(strategy, variant)
    model, optimizer, scheduler = fabric_setup(fabric, variant)
    state = {"model": model, "optimizer": optimizer}
    rest = fabric.load(path, state if scheduler is None else {**state, "scheduler": scheduler})
    assert rest["global_step"] == half and WEIGHTS_ONLY_KEY not in rest, rest.keys()
    second = fabric_train(fabric, model, optimizer, half, steps - half, scheduler)
    save_result(fabric, out, f"{spec}-trainer_to_fabric", module.losses + second, full_state(fabric, model))


def restage(out: Path, spec: str, steps: int) -> None:
    """``A:B``: Fabric trains the first half under preset A and saves; Fabric under preset B loads that checkpoint
    (another stage: through its universal form) and trains the second half."""
    first, second = spec.split(":")
    half = steps // 2
    fabric = fabric_for(first)
    model, optimizer, _ = fabric_setup(fabric)
    losses = fabric_train(fabric, model, optimizer, 0, half)
    path = out / f"{first}-for-{second}.ckpt"
    fabric.save(path, {"model": model, "optimizer": optimizer, "global_step": half})
    fabric = fabric_for(second)
    model, optimizer, _ = fabric_setup(fabric)
    rest = fabric.load(path, {"model": model, "optimizer": optimizer})
    assert rest["global_step"] == half, rest.keys()
    losses += fabric_train(fabric, model, optimizer, half, steps - half)
    save_result(fabric, out, f"{first}-to-{second}", losses, full_state(fabric, model))


NAMELESS = "-nameless"


def resume_under(out: Path, spec: str, steps: int, devices: int) -> None:
    """``CKPT:B``: Fabric under preset B (``B@VARIANT``: with that variant) on ``devices`` processes loads
    OUT/CKPT.ckpt, written at half the steps, and trains the second half."""
    checkpoint, target = spec.split(":")
    strategy, variant = Variant.of(target)
    half = steps // 2
    fabric = fabric_for(strategy, variant, devices)
    path = out / f"{checkpoint}.ckpt"
    if checkpoint.endswith(NAMELESS) and fabric.is_global_zero:
        content = torch.load(out / f"{checkpoint.removesuffix(NAMELESS)}.ckpt", weights_only=True)
        del content[PARAMETER_NAMES_KEY]
        torch.save(content, path)
    fabric.barrier()
    model, optimizer, scheduler = fabric_setup(fabric, variant)
    state = {"model": model, "optimizer": optimizer}
    rest = fabric.load(path, state if scheduler is None else {**state, "scheduler": scheduler})
    assert rest["global_step"] == half and WEIGHTS_ONLY_KEY not in rest, rest.keys()
    losses = fabric_train(fabric, model, optimizer, half, steps - half, scheduler)
    save_result(fabric, out, f"{checkpoint}-under-{target}-x{devices}", losses, full_state(fabric, model))


def trainer_under(out: Path, spec: str, steps: int) -> None:
    """``CKPT:B``: the Trainer under preset B on 2 processes resumes OUT/CKPT.ckpt, written at half the steps, through
    ``ckpt_path`` and trains the second half (its loop counters start at 0)."""
    checkpoint, target = spec.split(":")
    strategy, variant = Variant.of(target)
    half = steps // 2
    trainer = trainer_for(strategy, variant, steps - half)
    module = TailLM(half, steps - half, variant.scheduled)
    trainer.fit(module, ckpt_path=out / f"{checkpoint}.ckpt")
    state = trainer_state(trainer)
    if trainer.is_global_zero:
        result = {"losses": module.losses, "state_dict": state}
        torch.save(result, out / f"{checkpoint}-under-trainer-{target}-x2.pt")
    trainer.strategy.barrier()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--devices", type=int, default=2, help="processes of the --resume-under runs")
    parser.add_argument("--strategies", nargs="*", default=[])
    parser.add_argument("--resume", nargs="*", default=[])
    parser.add_argument("--restage", nargs="*", default=[])
    parser.add_argument("--resume-under", nargs="*", default=[])
    parser.add_argument("--trainer-under", nargs="*", default=[])
    parser.add_argument("--auto", nargs=2, type=float, metavar=("BUDGET", "TOO_SMALL"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    for strategy in args.strategies:
        fabric_run(args.out, strategy, args.steps)
    if args.auto:
        budget, too_small = args.auto
        zero_auto(args.out, budget, too_small, args.steps)
    for spec in args.resume:
        if Variant.of(spec)[1].scheduled:
            fabric_run(args.out, spec, args.steps)
        fabric_to_trainer(args.out, spec, args.steps)
        trainer_to_fabric(args.out, spec, args.steps)
    for spec in args.restage:
        restage(args.out, spec, args.steps)
    for spec in args.resume_under:
        announce(f"fabric:{spec}")
        resume_under(args.out, spec, args.steps, args.devices)
    for spec in args.trainer_under:
        announce(f"trainer:{spec}")
        trainer_under(args.out, spec, args.steps)
    end_process_group()


if __name__ == "__main__":
    main()
