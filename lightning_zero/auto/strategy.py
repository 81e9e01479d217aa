"""``zero_auto``: DeepSpeed ZeRO configured for the memory budget by measurement.

    Trainer(strategy="zero_auto")                                  # budget: the whole device
    Trainer(strategy=build_preset("zero_auto", memory_budget_gib=24, batch_size="max", cache_file="auto.json"))

At set-up, once the model exists: plan every DeepSpeed layout (:mod:`lightning_zero.auto.plan`, with a real
activation probe of the model on a batch of the data), take the few candidates the plan says fit
(:func:`lightning_zero.auto.search.candidates`: stage, optimizer offload incl. a partial ratio at stage 3,
activation checkpointing, micro-batch x accumulation, pinned host buffers on CUDA, bucket size), time a few
real optimizer steps of each on a copy of the model, and train with the highest samples/s that fitted. The
user's global batch (dataloader batch x processes x accumulation) is kept unless ``batch_size: max``. The
table of trials is logged; the choice is cached in ``cache_file`` (when given), keyed by model, sequence
length, devices, budget, precision, batch, ``approximate`` and versions, so the next run skips the search.
The approximate levers (bf16 optimizer states, ZenFlow) are tried only with ``approximate: true``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil
import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities import move_data_to_device, rank_zero_info
from lightning.pytorch.utilities.parsing import lightning_hasattr, lightning_setattr
from torch import nn

from lightning_zero.auto.cache import cached_choice, choice_key, package_versions, store_choice
from lightning_zero.auto.plan import PlanRow, candidate_layouts, make_plan
from lightning_zero.auto.run_rate import RunAgainstTrial
from lightning_zero.auto.search import (
    APPROXIMATE_LEVERS,
    BF16_STATES,
    MAX,
    ZENFLOW,
    Candidate,
    Measurement,
    OneCardRules,
    approximate_levers,
    candidate_from_dict,
    candidate_to_dict,
    candidates,
    choose,
    format_trials,
    judge,
    needless,
    retries,
    trial_result,
)
from lightning_zero.auto.trials import (
    OneCardSteps,
    StepPlan,
    TrialRefused,
    TrialSteps,
    copy_of,
    engine_steps,
    give_back_memory,
    run_trial,
)
from lightning_zero.errors import ZeroConfigError
from lightning_zero.internals import abstract_tensors, hand_over_strategy
from lightning_zero.memory.allocator import restore_allocator, use_expandable_segments
from lightning_zero.memory.budget import GIB
from lightning_zero.memory.probe import SavedLines, probe_activations, saved_bytes_lines
from lightning_zero.memory.states import ParameterShapes
from lightning_zero.precision import half_dtype
from lightning_zero.runtime.batches import first_tensor, samples_in, take_samples, training_loss
from lightning_zero.runtime.blocks import prepare_blocks
from lightning_zero.strategies.deepspeed import ZeroStrategy, engine_optimizer
from lightning_zero.strategies.deepspeed_config import DeepSpeedZeroConfig, TrainerValues
from lightning_zero.strategies.deepspeed_settings import DeepSpeedSettings
from lightning_zero.strategies.onecard import OneCardStrategy, lever_optimizer, precision_plugin, saved_tensors_context
from lightning_zero.strategies.onecard_config import OneCardConfig

#: Rounds of trying again at a smaller micro-batch (:func:`~lightning_zero.auto.search.retries`).
RETRY_ROUNDS = 2


@dataclasses.dataclass(frozen=True)
class AutoZeroConfig(DeepSpeedZeroConfig):
    """``zero_auto``'s settings; the DeepSpeed fields not searched (loss scaling, ...) apply as given.

    Args:
        batch_size: ``None``: keep the global batch the Trainer and dataloader give; an int: this global batch;
            ``"max"``: the largest micro-batch that fits, no accumulation.
        batch_arg_name: The module or datamodule attribute that sets the dataloader's batch size.
        max_micro_batch: Largest micro-batch considered.
        max_trials: DeepSpeed candidates timed, each with its approximate variants; on one device the one-card
            candidates are timed besides.
        trial_steps: Timed optimizer steps per candidate (after ``warmup_steps``).
        warmup_steps: Untimed optimizer steps per candidate.
        cache_file: JSON file where choices are cached (``None``: no cache).
        expandable_segments: On CUDA, switch the process's caching allocator to expandable segments (what
            ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` does) before the trials, so that the run's memory
            does not fragment beyond what its trials measured. Off: the allocator is left as it is, and a choice
            near the budget can run out of memory in a later step of the run.
        approximate: Also try the levers that change what training computes, not only how fast: bf16 optimizer
            states under optimizer offload (bf16 runs only), DeepSpeed's ZenFlow at stages 1-2 (no gradient
            accumulation), and on one device torchao's 8-bit AdamW stepped in backward (``onecard_adamw8bit``).
            Each offload candidate is then also timed with each that applies; the trials' table tags those rows
            ``~``. Off: exact Adam only.
    """

    batch_size: int | str | None = None
    batch_arg_name: str = "batch_size"
    max_micro_batch: int = 512
    max_trials: int = 4
    trial_steps: int = 3
    warmup_steps: int = 1
    cache_file: str | None = None
    expandable_segments: bool = True
    approximate: bool = False

    def __post_init__(self) -> None:
        for lever in APPROXIMATE_LEVERS:
            if getattr(self, lever):
                raise ZeroConfigError(
                    f"`zero_auto` chooses `{lever}` itself: remove it (`approximate: true` lets the search try it),"
                    f" or set it on a preset such as `zero2_offload`."
                )
        if self.offload_ratio != 1.0:
            raise ZeroConfigError("`zero_auto` chooses the offload ratio itself: remove `offload_ratio`.")
        super().__post_init__()
        size = self.batch_size
        if size is not None and size != MAX and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise ZeroConfigError(f"`batch_size` must be a positive global batch or 'max', got {size!r}.")
        if self.compile_blocks:
            raise ZeroConfigError(
                "`zero_auto` times its trials without compilation: set `compile_blocks` on a preset such as `zero2`."
            )
        for name in ("max_micro_batch", "max_trials", "trial_steps"):
            if getattr(self, name) < 1:
                raise ZeroConfigError(f"`{name}` must be at least 1, got {getattr(self, name)!r}.")


def candidate_zero(base: AutoZeroConfig, candidate: Candidate) -> DeepSpeedZeroConfig:
    """The DeepSpeed settings of a run of ``candidate``: ``base``'s, with the candidate's layout (the partial offload
    ratio included), pinning, bucket size and approximate lever (refused unless ``base.approximate``)."""
    if candidate.lever and not base.approximate:
        raise ZeroConfigError(f"`{candidate.lever}` is approximate: zero_auto tries it only with `approximate: true`.")
    given = {field.name: getattr(base, field.name) for field in dataclasses.fields(DeepSpeedZeroConfig)}
    return DeepSpeedZeroConfig(
        **{
            **given,
            **candidate.layout.config_fields(),
            "pin_memory": candidate.pin_memory,
            "reduce_bucket_size": candidate.bucket_size,
            "allgather_bucket_size": candidate.bucket_size,
            BF16_STATES: candidate.lever == BF16_STATES,
            ZENFLOW: candidate.lever == ZENFLOW,
        }
    )


def trial_settings(base: AutoZeroConfig, candidate: Candidate, values: TrainerValues) -> DeepSpeedSettings:
    """The settings, resolved with the Trainer's ``values``, that a trial of ``candidate``, and a run with it, use."""
    return DeepSpeedSettings.from_zero(candidate_zero(base, candidate)).with_trainer(values)


def candidate_onecard(base: AutoZeroConfig, candidate: Candidate) -> OneCardConfig:
    """The one-card settings of a run of ``candidate`` (a one-card layout): its levers, ``base``'s budget and
    allocator setting."""
    layout = candidate.layout
    if layout.approximate and not base.approximate:
        raise ZeroConfigError(f"`{layout.name}` is approximate: zero_auto tries it only with `approximate: true`.")
    fields = {key: value for key, value in layout.config_fields().items() if key != "offload_ratio"}
    return OneCardConfig(
        **fields,
        memory_budget_gib=base.memory_budget_gib,
        expandable_segments=base.expandable_segments,
        approximate=layout.approximate,
    )


def zero_auto_budget_gib(memory_budget_gib: float | None, device: torch.device) -> float:
    """``zero_auto``'s budget per device: ``memory_budget_gib``, or the whole of a CUDA device."""
    if memory_budget_gib is not None:
        return memory_budget_gib
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory / GIB
    raise ZeroConfigError("zero_auto off CUDA needs a budget: set `memory_budget_gib` (e.g. 4).")


class ChosenOneCard(OneCardStrategy):
    """The one-card strategy ``zero_auto`` hands its run to once a one-card candidate won; ``trainer.strategy`` from
    then on, with the search in :attr:`chosen_by` (its choice, trials and plan). Lightning restores a checkpoint's
    weights before a single-device strategy's setup, but that point passed under ``zero_auto``'s DeepSpeed
    strategy, which restores after: so does this one."""

    def __init__(self, chosen_by: ZeroAutoStrategy, zero: OneCardConfig, **kwargs: Any) -> None:
        super().__init__(zero, **kwargs)
        self.chosen_by = chosen_by

    @property
    def restore_checkpoint_after_setup(self) -> bool:
        return True


class ZeroAutoStrategy(ZeroStrategy):
    """DeepSpeed ZeRO with stage, offload, checkpointing, micro-batch and buffers chosen by measurement; on one
    device the one-card levers are candidates too, and when one wins the run goes on under it
    (:class:`ChosenOneCard`, in :attr:`handed_over_to`).

    Args:
        zero: An :class:`AutoZeroConfig` or a mapping of its fields.
        **kwargs: As for :class:`~lightning_zero.strategies.deepspeed.ZeroStrategy`.
    """

    strategy_name = "zero_auto"

    def __init__(self, zero: AutoZeroConfig | Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        auto = AutoZeroConfig.coerce(zero)
        super().__init__(zero=auto, **kwargs)
        self.auto: AutoZeroConfig = auto
        self.chosen: Candidate | None = None
        self.trials: list[Measurement] = []
        self.plan_rows: list[PlanRow] = []
        self.from_cache = False
        self.handed_over_to: OneCardStrategy | None = None
        self.run_against_trial: RunAgainstTrial | None = None
        self._allocator_before: str | None = None

    def setup(self, trainer: Any) -> None:
        assert self.lightning_module is not None
        if self.auto.expandable_segments:
            self._allocator_before = use_expandable_segments(self.root_device, "zero_auto")
        first_batch = _first_batch(trainer, self.lightning_module)
        candidate = self.search(trainer, first_batch)
        if candidate.micro_batch != samples_in(first_batch):
            if not lightning_hasattr(self.lightning_module, self.auto.batch_arg_name):
                raise ZeroConfigError(
                    f"zero_auto sets `{self.auto.batch_arg_name}` but neither the module nor the datamodule has it:"
                    " add it or set `batch_arg_name`."
                )
            lightning_setattr(self.lightning_module, self.auto.batch_arg_name, candidate.micro_batch)
        trainer.accumulate_grad_batches = candidate.accumulation
        self.chosen = candidate
        rank_zero_info(f"zero_auto chose {candidate.name}.")
        self._time_the_run(trainer, candidate)
        if candidate.layout.backend == "onecard":
            self._hand_over(trainer, candidate)
            return
        # Lightning may have resolved the config already (``configure_model`` asks for it): resolve this one.
        self.settings = trial_settings(self._base(), candidate, self._candidate_values(trainer, candidate))
        super().setup(trainer)

    def teardown(self) -> None:
        super().teardown()
        if self._allocator_before is not None:
            restore_allocator(self._allocator_before)
            self._allocator_before = None

    def _time_the_run(self, trainer: Any, candidate: Candidate) -> None:
        """Have the run say its samples/s beside its trial's (:attr:`run_against_trial`; not for a cached choice)."""
        trial = next((m for m in self.trials if m.candidate == candidate and m.fits), None)
        if trial is None:
            return
        per_step = candidate.micro_batch * candidate.accumulation * self.world_size
        self.run_against_trial = RunAgainstTrial(trial.samples_per_sec, per_step, self.auto.warmup_steps)
        trainer.callbacks.append(self.run_against_trial)

    def _hand_over(self, trainer: Any, candidate: Candidate) -> None:
        """Go on with the run under the one-card strategy of ``candidate``: Lightning fixes a Trainer's strategy
        before the model exists, and only trials of the model say which wins. This strategy ends first as after a
        run (its rank watchdog, its allocator setting, DeepSpeed's world of one that the trials used)."""
        module = self.lightning_module
        assert module is not None
        self.teardown()
        self.end_process_groups()
        chosen = ChosenOneCard(
            self,
            candidate_onecard(self._base(), candidate),
            device=self.root_device,
            accelerator=self.accelerator,
            precision_plugin=precision_plugin(str(self.precision_plugin.precision), self.root_device),
        )
        chosen.connect(module)
        hand_over_strategy(trainer, chosen)
        self.handed_over_to = chosen
        chosen.setup_environment()
        chosen.setup(trainer)

    def _base(self) -> AutoZeroConfig:
        return self.auto.replace(memory_budget_gib=self._budget_gib())

    def _budget_gib(self) -> float:
        return zero_auto_budget_gib(self.auto.memory_budget_gib, self.root_device)

    def search(self, trainer: Any, first_batch: Any) -> Candidate:
        """The cached choice for this model and setting, or the best of the trials (identical on every rank).

        ``first_batch`` is the run's first training batch: the probe and the trials run on its samples.
        """
        module = self.lightning_module
        assert module is not None
        batch = move_data_to_device(first_batch, self.root_device)
        shapes = ParameterShapes.of(module)
        global_batch = self._global_batch(trainer, samples_in(first_batch))
        key = self._cache_key(module, shapes, batch, global_batch)
        cached = self.broadcast(self._read_cache(key))
        if cached is not None:
            self.from_cache = True
            rank_zero_info(f"zero_auto: using the cached choice from {self.auto.cache_file}.")
            return candidate_from_dict(cached)
        with self._resident_on_host(module):
            tried = self.broadcast(self._candidates(trainer, module, shapes, batch, global_batch))
            latest = self.trials = self._measure_all(trainer, module, batch, tried)
            for _ in range(RETRY_ROUNDS):
                tried = retries(self.trials, latest, keep_global_batch=global_batch != MAX)
                if not tried:
                    break
                latest = self._measure_all(trainer, module, batch, tried, earlier=self.trials)
                self.trials = self.trials + latest
            left = self._reserved_now()
        best = choose(self.trials)
        rank_zero_info(format_trials(self.trials, best))
        if left:
            rank_zero_info(f"zero_auto: {left / GIB:.2f} GiB stays reserved on the device after the trials.")
        if self.is_global_zero:
            self._write_cache(key, best.candidate)
        return best.candidate

    def _measure_all(
        self,
        trainer: Any,
        module: LightningModule,
        batch: Any,
        tried: list[Candidate],
        earlier: Sequence[Measurement] = (),
    ) -> list[Measurement]:
        """The trials of ``tried`` in order, leaving out the :func:`needless` ones (given the ``earlier`` trials)."""
        trials: list[Measurement] = []
        for candidate in tried:
            if not needless(candidate, [*earlier, *trials]):
                trials.append(self.measure(trainer, module, batch, candidate))
        return trials

    def _candidates(
        self, trainer: Any, module: LightningModule, shapes: ParameterShapes, batch: Any, global_batch: int | str
    ) -> list[Candidate]:
        precision = str(self.precision_plugin.precision)
        if self.root_device.type == "cuda":
            # DeepSpeed runs the module in its 16-bit dtype without autocast: probe a copy of it that way.
            samples = self.precision_plugin.convert_input(batch)
            saved = self._saved_bytes_abstractly(trainer, module, samples)
            probe_model = copy_of(module, trainer, self._engine_dtype(), self.root_device)
            loss = training_loss(probe_model)
            probe = probe_activations(probe_model, loss, samples, device=self.root_device, saved=saved)
            del probe_model
            give_back_memory(self.root_device)
        else:
            probe = probe_activations(module, training_loss(module), batch, precision, self.root_device)
        backends = ("deepspeed", "onecard") if self.world_size == 1 else ("deepspeed",)
        layouts = [layout for layout in candidate_layouts() if layout.backend in backends]
        rows = make_plan(shapes, probe, self._budget_gib(), self.num_processes, self.num_nodes, precision, 1, layouts)
        self.plan_rows = rows
        rows = [
            dataclasses.replace(row, max_micro_batch=min(row.max_micro_batch, self.auto.max_micro_batch))
            for row in rows
        ]
        found = candidates(
            rows,
            self.world_size,
            global_batch,
            shapes.total,
            self.root_device.type == "cuda",
            self.auto.max_trials,
            host_free_bytes=psutil.virtual_memory().available,
            levers=approximate_levers(
                self.auto.approximate, precision, self.auto.cpu_adam_for_offload, self.root_device.type == "cuda"
            ),
            onecard=OneCardRules(self.root_device.type == "cuda", self.auto.approximate, precision),
        )
        fitting = sum(row.max_micro_batch >= 1 for row in rows)
        rank_zero_info(
            f"zero_auto: the plan fits {fitting} of {len(rows)} layouts in {self._budget_gib():g} GiB;"
            f" timing {len(found)} (no offload first, then larger micro-batches)."
        )
        return found

    def _saved_bytes_abstractly(self, trainer: Any, module: LightningModule, samples: Any) -> SavedLines | None:
        """The module's saved bytes counted on an abstract copy (no device memory: two samples of a 3B model at 2048
        tokens save 19 GiB); ``None`` where its step has an operation with no abstract form (``loss.item()``), and
        the probe counts on the device."""
        try:
            with abstract_tensors():
                counted = copy_of(module, trainer, self._engine_dtype(), self.root_device)
                return saved_bytes_lines(counted, training_loss(counted), samples)
        except (RuntimeError, NotImplementedError):  # fake tensors raise these for what they cannot run
            return None

    def measure(self, trainer: Any, module: LightningModule, batch: Any, candidate: Candidate) -> Measurement:
        """Time ``trial_steps`` optimizer steps of ``candidate`` on a copy of ``module``; collective on all ranks.

        The copy is prepared and its optimizer built by the functions the run uses (``prepare_blocks``, and
        ``engine_optimizer`` with ``initialize_engine`` under DeepSpeed, ``lever_optimizer`` on one card), from the
        config a run of ``candidate`` has.
        """
        rank_zero_info(f"zero_auto: timing {candidate.name} ...")  # a run ended mid-trial says which one
        onecard = candidate.layout.backend == "onecard"
        opener = self._onecard_steps if onecard else self._engine_steps
        steps = StepPlan(self.auto.warmup_steps, self.auto.trial_steps)
        # The whole process's peak counts: memory earlier trials left allocated will be there in the run too.
        self._reset_peak()
        outcome = run_trial(opener(trainer, module, batch, candidate), steps, self.root_device)
        peak = self._peak_allocated()
        ran = self.reduce_boolean_decision(outcome.ran, all=True)
        samples_seen = candidate.micro_batch * candidate.accumulation * self.world_size * outcome.steps
        rate = float(self.broadcast(samples_seen / outcome.seconds if outcome.seconds > 0 else 0.0))
        measurement = judge(candidate, ran, outcome.reason, peak, self._budget_gib() * GIB, rate)
        after = ""
        if self.root_device.type == "cuda":  # what a trial left behind would be missing from the run's budget
            after = f"; {torch.cuda.memory_allocated(self.root_device) / GIB:.2f} GiB allocated on the device after it"
        rank_zero_info(f"zero_auto: {candidate.name}: {trial_result(measurement).strip()}{after}.")
        return measurement

    def _engine_steps(
        self, trainer: Any, module: LightningModule, batch: Any, candidate: Candidate
    ) -> Callable[[], TrialSteps]:
        settings = trial_settings(self._base(), candidate, self._candidate_values(trainer, candidate))
        zero = settings.zero

        def build() -> tuple[LightningModule, torch.optim.Optimizer]:
            trial = copy_of(module, trainer, self._engine_dtype())
            prepare_blocks(trial, zero.activation_checkpointing, zero.compile_blocks)
            # Lightning steps the scheduler, never the engine (it takes it off the run's engine): none here.
            optimizer, _ = engine_optimizer(trial, zero)
            if candidate.lever and not _is_deepspeed_cpu_adam(optimizer):
                raise TrialRefused("needs a plain torch Adam/AdamW from `configure_optimizers`")
            return trial, optimizer

        samples = self.precision_plugin.convert_input(take_samples(batch, candidate.micro_batch))
        return engine_steps(build, settings.deepspeed_dict(), self._device_rank, samples, candidate.accumulation)

    def _onecard_steps(
        self, trainer: Any, module: LightningModule, batch: Any, candidate: Candidate
    ) -> Callable[[], TrialSteps]:
        config = candidate_onecard(self._base(), candidate)
        precision = str(self.precision_plugin.precision)
        plugin = precision_plugin(precision, self.root_device)
        samples = plugin.convert_input(take_samples(batch, candidate.micro_batch))
        dtype = half_dtype(precision) if precision.endswith("-true") else None

        @contextlib.contextmanager
        def forward() -> Iterator[None]:
            with plugin.train_step_context(), saved_tensors_context(config, self.root_device):
                yield

        def open_steps() -> TrialSteps:
            trial = copy_of(module, trainer, dtype, self.root_device)
            prepare_blocks(trial, config.activation_checkpointing, config.compile_blocks)
            try:
                optimizer = lever_optimizer(trial, config)
            except ZeroConfigError as refused:
                raise TrialRefused(str(refused)) from None
            return OneCardSteps(trial, optimizer, samples, forward)

        return open_steps

    def _candidate_values(self, trainer: Any, candidate: Candidate) -> TrainerValues:
        return TrainerValues(
            micro_batch_size=candidate.micro_batch,
            accumulate_grad_batches=candidate.accumulation,
            gradient_clip_val=trainer.gradient_clip_val,
            precision=str(self.precision_plugin.precision),
        )

    @contextlib.contextmanager
    def _resident_on_host(self, module: LightningModule) -> Iterator[None]:
        """Keep the module the run will train in host memory while the probe and trials use the device.

        Each of them holds a copy of the model, its gradients and its optimizer state: next to the resident
        fp32 module (11 GiB for t5-3b) they would not fit the budget they are meant to measure. Moving the module
        there and back leaves its values unchanged. It goes back where it was: Lightning leaves it in host memory
        for DeepSpeed, which casts it to 16 bits there and then moves it, as in the trials (moved to the device
        first, it would be cast there, the fp32 and 16-bit copies side by side).
        """
        if self.root_device.type != "cuda":
            yield
            return
        resident = next((p.device for p in module.parameters()), torch.device("cpu"))
        module.to("cpu")
        torch.cuda.empty_cache()
        yield  # on an error the module stays on the host: moving it back could hide the error behind an OOM
        module.to(resident)

    def _engine_dtype(self) -> torch.dtype:
        """The dtype DeepSpeed converts the module to for the run's precision (fp32 when it does not)."""
        return half_dtype(self.precision_plugin.precision) or torch.float32

    def _reset_peak(self) -> None:
        if self.root_device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.root_device)

    def _peak_allocated(self) -> int:
        """The largest device memory allocated on any rank since :meth:`_reset_peak` (0 off CUDA)."""
        return self._most_over_ranks(torch.cuda.max_memory_allocated)

    def _reserved_now(self) -> int:
        """The device memory reserved now on the rank that holds the most (0 off CUDA)."""
        return self._most_over_ranks(torch.cuda.memory_reserved)

    def _most_over_ranks(self, reserved: Callable[[torch.device], int]) -> int:
        local = reserved(self.root_device) if self.root_device.type == "cuda" else 0
        return int(self.reduce(torch.tensor(local, device=self.root_device), reduce_op="max").item())

    def _global_batch(self, trainer: Any, per_device: int) -> int | str:
        if self.auto.batch_size is not None:
            return self.auto.batch_size
        return per_device * self.world_size * int(trainer.accumulate_grad_batches)

    def _cache_key(self, module: nn.Module, shapes: ParameterShapes, batch: Any, global_batch: int | str) -> str:
        return choice_key(
            model=type(module).__qualname__,
            parameters=shapes.total,
            shapes=hash(shapes.shapes),
            sample_shape=_sample_shape(batch),
            devices=self.num_processes,
            nodes=self.num_nodes,
            budget=self._budget_gib(),
            precision=str(self.precision_plugin.precision),
            batch=global_batch,
            trials=(self.auto.max_trials, self.auto.max_micro_batch),
            expandable_segments=self.auto.expandable_segments,
            approximate=self._approximate_settings(),
            versions=package_versions(),
        )

    def _approximate_settings(self) -> object:
        """What of the config the approximate trials depend on (``False`` when there are none)."""
        if not self.auto.approximate:
            return False
        auto = self.auto
        zenflow = (auto.zenflow_topk_ratio, auto.zenflow_update_interval, auto.zenflow_select_interval)
        return (True, *zenflow, auto.zenflow_overlap_step, auto.zenflow_full_warm_up_rounds)

    def _read_cache(self, key: str) -> dict[str, Any] | None:
        if not self.is_global_zero or self.auto.cache_file is None:
            return None
        return cached_choice(Path(self.auto.cache_file), key)

    def _write_cache(self, key: str, candidate: Candidate) -> None:
        if self.auto.cache_file is not None:
            store_choice(Path(self.auto.cache_file), key, candidate_to_dict(candidate))


def _is_deepspeed_cpu_adam(optimizer: torch.optim.Optimizer) -> bool:
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    return isinstance(optimizer, DeepSpeedCPUAdam)


def _first_batch(trainer: Any, module: Any) -> Any:
    datamodule = getattr(trainer, "datamodule", None)
    source = datamodule if datamodule is not None and hasattr(datamodule, "train_dataloader") else module
    return next(iter(source.train_dataloader()))


def _sample_shape(batch: Any) -> list[int]:
    tensor = first_tensor(batch)
    return list(tensor.shape[1:]) if tensor is not None else []
