"""Hugging Face Accelerate's DeepSpeed as its users run it: a plain PyTorch loop, no Lightning.

Configured as Accelerate's DeepSpeed guide shows: a ``DeepSpeedPlugin`` given a DeepSpeed config whose ``"auto"``
values Accelerate fills from the dataloader and the model, then ``accelerator.prepare(model, optimizer,
dataloader)``, ``accelerator.backward(loss)``, ``optimizer.step()``. The loop passes a torch AdamW; Accelerate
swaps it for DeepSpeed's CPU Adam under optimizer offload. Under DeepSpeed, ``accelerator.backward`` also runs the
engine's optimizer step (``optimizer.step()`` is then a no-op): the profiled backward share holds both. Under
ZeRO-3 Accelerate tells transformers, so the model is built partitioned (``zero.Init``). The worker's search and
measurement controllers see each step through the hooks a Lightning fit calls them with, in the same order;
:class:`LoopTrainer` holds the few Trainer attributes they read.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from benchmarks.bench.catalogue import Experiment, Lengths, StrategySpec
from benchmarks.bench.controller import Controller
from benchmarks.bench.workload import (
    AUTO_CLASSES,
    LOADER_ITEMS,
    BatchMaker,
    build_workload_model,
    cap_gpu_memory,
    step_loader,
)
from lightning_zero.app.models.loading import import_model_class

#: Lightning's precision names and Accelerate's ``mixed_precision`` for the same training.
MIXED_PRECISION = {"32-true": "no", "32": "no", "bf16-mixed": "bf16", "16-mixed": "fp16"}
#: The DeepSpeed ZeRO layouts an Accelerate row can take, by the preset each corresponds to.
ZERO_LAYOUTS: dict[str, dict[str, Any]] = {
    "zero2_offload": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
    "zero3_offload": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}},
}


def deepspeed_plugin(spec: StrategySpec, given: dict[str, Any] | None) -> Any:
    """The ``DeepSpeedPlugin`` of an Accelerate row: the config ``given`` (a same-config pair: ours, resolved), or,
    for a row whose ``zero`` says ``plugin_defaults``, the plugin's own arguments alone (ZeRO stage and offload
    devices; everything else Accelerate's and DeepSpeed's defaults, as a user gets with no config file), else
    :func:`deepspeed_config`."""
    from accelerate.utils import DeepSpeedPlugin

    if given is not None:
        return DeepSpeedPlugin(hf_ds_config=given)
    if spec.zero.get("plugin_defaults"):
        layout = ZERO_LAYOUTS[spec.strategy]
        return DeepSpeedPlugin(
            zero_stage=layout["stage"],
            offload_optimizer_device=layout["offload_optimizer"]["device"],
            offload_param_device=layout.get("offload_param", {}).get("device", "none"),
        )
    return DeepSpeedPlugin(hf_ds_config=deepspeed_config(spec))


def deepspeed_config(spec: StrategySpec) -> dict[str, Any]:
    """The DeepSpeed config an Accelerate row hands to ``DeepSpeedPlugin(hf_ds_config=...)``.

    Batch and bucket sizes are ``"auto"``, as in Accelerate's examples. Gradients are not clipped, like every other
    row (Lightning's Trainer and ours pass 0; Accelerate would fill 1.0).
    """
    if spec.strategy not in ZERO_LAYOUTS:
        raise ValueError(f"no Accelerate layout for {spec.strategy!r}: choose from {sorted(ZERO_LAYOUTS)}")
    return {
        "train_micro_batch_size_per_gpu": "auto",
        "train_batch_size": "auto",
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.0,
        "zero_optimization": {
            **ZERO_LAYOUTS[spec.strategy],
            "reduce_bucket_size": "auto",
            "stage3_prefetch_bucket_size": "auto",
            "stage3_param_persistence_threshold": "auto",
        },
    }


@dataclasses.dataclass
class LoopStrategy:
    """What the controllers read from a Lightning strategy: the device, the DeepSpeed engine, a reduction."""

    root_device: torch.device
    world_size: int
    deepspeed_engine: Any = None

    def reduce(self, tensor: torch.Tensor, reduce_op: str = "max") -> torch.Tensor:
        """The element-wise maximum over ranks (the only reduction the controllers ask for)."""
        assert reduce_op == "max", reduce_op
        if self.world_size > 1:
            torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
        return tensor


@dataclasses.dataclass
class LoopTrainer:
    """What the controllers read from a Lightning Trainer."""

    strategy: LoopStrategy
    should_stop: bool = False
    precision_plugin: Any = None

    @property
    def world_size(self) -> int:
        return self.strategy.world_size


@dataclasses.dataclass
class LoopStep:
    """What the controllers read from the module after a step: its micro-batch and the batch's shape facts."""

    last_batch: int = 0
    last_facts: dict[str, int] = dataclasses.field(default_factory=dict)


def run_accelerate_fit(
    experiment: Experiment,
    spec: StrategySpec,
    lengths: Lengths,
    controller: Controller,
    memory_cap_gib: float,
    precision: str,
    batch: int,
    seed: int,
    given_config: dict[str, Any] | None = None,
) -> None:
    """Train ``experiment`` under Accelerate's DeepSpeed until ``controller`` stops it; ``batch`` fills DeepSpeed's
    ``"auto"`` micro-batch (the controller sets each step's own); ``given_config``: :func:`deepspeed_plugin`."""
    from accelerate import Accelerator
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    # where the controllers' hooks take a Lightning Trainer and module
    step: Any = LoopStep()
    trainer: Any = None
    try:
        plugin = deepspeed_plugin(spec, given_config)
        accelerator = Accelerator(mixed_precision=MIXED_PRECISION[precision], deepspeed_plugin=plugin)
        cap_gpu_memory(accelerator.device, memory_cap_gib)
        trainer = LoopTrainer(LoopStrategy(accelerator.device, accelerator.num_processes))
        controller.setup(trainer, step, "fit")
        import_model_class(AUTO_CLASSES[experiment.task], f"shape:{experiment.shape}")  # before zero.Init opens
        model = build_workload_model(experiment, spec)
        vocab = int(model.config.vocab_size)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
        model, optimizer, loader = accelerator.prepare(model, optimizer, step_loader(LOADER_ITEMS, batch))
        trainer.strategy.deepspeed_engine = model
        maker = BatchMaker(experiment.task, lengths, vocab, seed + accelerator.process_index)
        controller.on_fit_start(trainer, step)
        model.train()
        for index, _ in enumerate(loader):
            controller.on_train_batch_start(trainer, step, None, index)
            size, worst = controller.next_batch()
            inputs, step.last_facts = maker.make(size, accelerator.device, worst)
            step.last_batch = size
            loss = model(**inputs).loss
            controller.on_before_backward(trainer, step, loss)
            accelerator.backward(loss)
            controller.on_after_backward(trainer, step)
            optimizer.step()
            optimizer.zero_grad()
            controller.on_train_batch_end(trainer, step, loss, None, index)
            if trainer.should_stop:
                break
    except BaseException as error:
        controller.on_exception(trainer, step, error)  # records it and ends the process
        raise
    accelerator.free_memory()
    unset_hf_deepspeed_config()
