"""The training workload of a row: a model shape, synthetic batches of realistic lengths, and the strategy.

Batches are made on the device inside ``training_step`` (random token ids, lengths from
:mod:`benchmarks.bench.lengths`), so a search can change the micro-batch from one step to the next and no
data loader stands between the GPU and the measurement. The data loader only counts steps; for ``zero_auto``
rows it also sets the micro-batch (``batch_size``, which the strategy changes to the one it chose).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoModelForSequenceClassification

from benchmarks.bench.catalogue import CHUNKED_LOSS_KINDS, Experiment, Lengths, StrategySpec
from benchmarks.bench.lengths import LengthDistribution, load_distribution, padded
from lightning_zero.app.models.loading import build_model, import_model_class
from lightning_zero.app.tasks.losses import causal_lm_nll, supports_chunked_loss

GIB = 1024**3
IGNORE_INDEX = -100
AUTO_CLASSES: dict[str, Any] = {
    "seq2seq": AutoModelForSeq2SeqLM,
    "causal": AutoModelForCausalLM,
    "classification": AutoModelForSequenceClassification,
}
_CONFIG_OVERRIDES: dict[str, dict[str, Any]] = {
    "classification": {"num_labels": 2},
    "seq2seq": {"decoder_start_token_id": 0, "pad_token_id": 0},
    "causal": {},
}


class BatchMaker:
    """Synthetic batches of one length setting: fixed at the maxima, or drawn from a stored distribution."""

    def __init__(self, task: str, lengths: Lengths, vocab_size: int, seed: int) -> None:
        self.task, self.lengths, self.vocab_size = task, lengths, vocab_size
        self.rng = random.Random(seed)
        self.distribution: LengthDistribution | None = load_distribution(lengths.name) if lengths.dynamic else None

    def worst_lengths(self) -> tuple[int, int]:
        """The padded lengths of the longest batch an epoch can hold (what a search must fit)."""
        if self.distribution is None:
            return self.lengths.source, self.lengths.target
        return self.distribution.worst(self.lengths.source, self.lengths.target)

    def example_lengths(self, batch: int, worst: bool) -> list[tuple[int, int]]:
        if worst or self.distribution is None:
            return [self.worst_lengths()] * batch
        return self.distribution.draw(batch, self.rng, self.lengths.source, self.lengths.target)

    def make(self, batch: int, device: torch.device, worst: bool = False) -> tuple[dict[str, torch.Tensor], dict]:
        """A batch dict for the model and its shape facts (padded lengths, real tokens)."""
        sizes = self.example_lengths(batch, worst)
        source = padded(max(s for s, _ in sizes))
        ids = torch.randint(3, self.vocab_size, (batch, source), device=device)
        mask = (
            torch.arange(source, device=device)[None, :] < torch.tensor([s for s, _ in sizes], device=device)[:, None]
        ).long()
        inputs: dict[str, torch.Tensor] = {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask}
        facts = {"source": source, "target": 0, "tokens": sum(s for s, _ in sizes)}
        if self.task == "classification":
            inputs["labels"] = torch.randint(0, 2, (batch,), device=device)
        elif self.task == "causal":
            inputs["labels"] = inputs["input_ids"].masked_fill(mask == 0, IGNORE_INDEX)
        else:
            target = padded(max(t for _, t in sizes))
            labels = torch.randint(3, self.vocab_size, (batch, target), device=device)
            lengths = torch.tensor([t for _, t in sizes], device=device)
            inputs["labels"] = labels.masked_fill(
                torch.arange(target, device=device)[None, :] >= lengths[:, None], IGNORE_INDEX
            )
            facts["target"] = target
            facts["tokens"] += sum(t for _, t in sizes)
        return inputs, facts


class BenchModule(L.LightningModule):
    """One shape, built in ``configure_model`` (ZeRO-3 builds it partitioned), trained on made-up batches.

    Args:
        experiment: The experiment (shape and task).
        spec: The strategy, for the optimizer choice and Hugging Face checkpointing by hand.
        next_batch: Called at every step: the micro-batch to run and whether to use the worst-case lengths
            (``None`` for rows whose dataloader sets the micro-batch: :attr:`StrategySpec.loader_driven`).
        memory_cap_gib: Per-process cap on GPU memory (``set_per_process_memory_fraction``); 0: none.
        seed: Seed of the batch lengths.
        batch_size: The dataloader's batch, for rows whose dataloader sets the micro-batch.
    """

    def __init__(
        self,
        experiment: Experiment,
        spec: StrategySpec,
        lengths: Lengths,
        next_batch: Callable[[], tuple[int, bool]] | None,
        memory_cap_gib: float,
        seed: int = 0,
        batch_size: int = 1,
    ) -> None:
        super().__init__()
        self.experiment, self.spec, self.lengths_spec = experiment, spec, lengths
        self.next_batch, self.memory_cap_gib, self.seed = next_batch, memory_cap_gib, seed
        self.batch_size = batch_size
        self.model: Any = None
        self.maker: BatchMaker | None = None
        self.last_facts: dict[str, int] = {}
        self.last_batch = 0
        self.hf_zero3: Any = None
        self.chunked_loss = False

    def setup(self, stage: str) -> None:
        import_model_class(AUTO_CLASSES[self.experiment.task], f"shape:{self.experiment.shape}")  # as the tasks do
        cap_gpu_memory(self.device, self.memory_cap_gib)  # Lightning sets the device before this hook

    def configure_model(self) -> None:
        if self.model is not None:
            return
        strategy: Any = self.trainer.strategy
        if self.spec.kind == "lightning" and getattr(strategy, "zero_stage_3", False):
            self._tell_transformers_zero3_is_on(strategy.config)
        self.model = build_workload_model(self.experiment, self.spec)
        self.chunked_loss = uses_chunked_loss(self.experiment, self.spec, self.model)
        vocab = int(self.model.config.vocab_size)
        self.maker = BatchMaker(self.experiment.task, self.lengths_spec, vocab, self.seed + self.global_rank)

    def _tell_transformers_zero3_is_on(self, deepspeed_config: dict[str, Any]) -> None:
        """What transformers' docs tell a user of DeepSpeed outside its Trainer to do before building a model
        under ZeRO-3 (Lightning's strategy does not; lightning-zero's does it itself): without it, transformers
        (5.17, 5.24) initialises the partitioned (empty) weights in place and DeBERTa-v2's padding row fails to
        index. The object must stay alive while the model is built; :meth:`teardown` lets go of it."""
        from transformers.integrations import HfDeepSpeedConfig

        self.hf_zero3 = HfDeepSpeedConfig(deepspeed_config)

    def teardown(self, stage: str) -> None:
        if self.hf_zero3 is not None:
            from transformers.integrations.deepspeed import unset_hf_deepspeed_config

            unset_hf_deepspeed_config()
            self.hf_zero3 = None

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        assert self.model is not None and self.maker is not None
        size, worst = self.next_batch() if self.next_batch is not None else (int(batch.shape[0]), False)
        inputs, self.last_facts = self.maker.make(size, self.device, worst)
        self.last_batch = size
        if self.chunked_loss:  # as CausalLMTask computes it: the same mean over scored tokens as the model's own
            nll, tokens = causal_lm_nll(
                self.model, inputs["input_ids"], inputs["attention_mask"], inputs["labels"], self.chunk_tokens
            )
            return nll / tokens
        return self.model(**inputs).loss

    @property
    def chunk_tokens(self) -> int:
        assert self.experiment.loss_chunk_tokens is not None
        return self.experiment.loss_chunk_tokens

    def configure_optimizers(self) -> torch.optim.Optimizer:
        if self.spec.kind == "lightning" and self.spec.offloads:
            # Lightning's DeepSpeed offload refuses a torch optimizer; its docs tell users to use this one.
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            return DeepSpeedCPUAdam(self.parameters(), lr=1e-5)
        return torch.optim.AdamW(self.parameters(), lr=1e-5)

    def train_dataloader(self) -> DataLoader:
        """Item indices in batches of ``batch_size`` (rows whose dataloader sets the micro-batch)."""
        return step_loader(LOADER_ITEMS, self.batch_size)


def cap_gpu_memory(device: torch.device, cap_gib: float) -> None:
    """Cap this process's memory on a CUDA ``device`` at ``cap_gib`` (the emulated card); nothing elsewhere or at 0."""
    if cap_gib and device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap_gib * GIB / total), device)


def build_workload_model(experiment: Experiment, spec: StrategySpec) -> Any:
    """The experiment's model, with Hugging Face gradient checkpointing switched on by hand where ``spec`` says, as
    a Lightning or Accelerate user would (non-reentrant, as lightning-zero's own), and no cache of past keys."""
    task = experiment.task
    model: Any = build_model(
        AUTO_CLASSES[task], f"shape:{experiment.shape}", vocab_size=experiment.vocab_size, **_CONFIG_OVERRIDES[task]
    )
    if spec.hf_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if hasattr(model.config, "use_cache"):
        model.config.use_cache = False
    return model


def uses_chunked_loss(experiment: Experiment, spec: StrategySpec, model: Any) -> bool:
    """Whether the row computes its causal-LM loss in chunks (:attr:`Experiment.loss_chunk_tokens`): our DeepSpeed
    rows, on models whose chunked loss is exact."""
    chunked = experiment.loss_chunk_tokens is not None and spec.kind in CHUNKED_LOSS_KINDS
    return chunked and supports_chunked_loss(model)


#: Items of a loader-driven row's dataloader: more than any measurement takes.
LOADER_ITEMS = 10**9


def step_loader(steps: int, batch_size: int = 1) -> DataLoader:
    """A loader of ``steps`` dummy items in batches of ``batch_size``: the module makes the real batches."""
    items: Any = range(steps)
    return DataLoader(items, batch_size=batch_size)


def make_strategy(
    spec: StrategySpec,
    devices: int,
    deepspeed_config: dict[str, Any] | None = None,
    memory_cap_gib: float = 0.0,
    accelerator: str = "gpu",
) -> Any:
    """The Trainer's ``strategy`` argument for ``spec`` (a name, or a built strategy when fields are overridden).

    ``zero_auto`` rows get ``memory_cap_gib`` as their memory budget. Lightning's rows on ``accelerator="cpu"``
    (the harness's own tests) get :func:`lightning_deepspeed_on_cpu`.
    """
    if spec.kind == "auto" and memory_cap_gib:
        spec = dataclasses.replace(spec, zero={"memory_budget_gib": memory_cap_gib, **spec.zero})
    if deepspeed_config is not None:
        if spec.kind == "lightning":
            from lightning.pytorch.strategies import DeepSpeedStrategy

            return DeepSpeedStrategy(config=deepspeed_config)
        from lightning_zero.strategies import ZeroStrategy

        return ZeroStrategy(deepspeed_config=deepspeed_config)
    if spec.kind == "single":
        return "ddp" if devices > 1 else "auto"
    if spec.kind == "lightning" and accelerator == "cpu":
        return lightning_deepspeed_on_cpu(spec.strategy)
    if spec.zero:
        return _registered_variant(spec)
    return spec.strategy


def _registered_variant(spec: StrategySpec) -> str:
    """Register ``spec`` (a preset with fields overridden) under a name of its own, and return the name.

    By name, not as an instance: Lightning refuses ``16-mixed`` for a ``ModelParallelStrategy`` instance (our
    FSDP2 presets) before the strategy is asked, but not for a registered name.
    """
    from functools import partial

    from lightning.pytorch.strategies import StrategyRegistry

    from lightning_zero.presets import build_preset

    name = f"bench-{spec.label}"
    factory = partial(build_preset, spec.strategy, **dict(spec.zero))
    StrategyRegistry.register(name, factory, description=f"benchmark variant {spec.label}", override=True)
    return name


def lightning_deepspeed_on_cpu(name: str) -> Any:
    """Lightning's registered DeepSpeed strategy ``name`` (its own class and settings) made to start on CPU, for the
    harness's CPU tests: Lightning refuses anything but CUDA at set-up and passes DeepSpeed a device index that is
    ``None`` on CPU; lightning-zero's set-up stands in for those two places only, the step path is Lightning's."""
    from lightning.pytorch.strategies import StrategyRegistry

    from lightning_zero.strategies.deepspeed import _DeepSpeedOnCpu

    return _DeepSpeedOnCpu(**StrategyRegistry[name]["init_params"])
