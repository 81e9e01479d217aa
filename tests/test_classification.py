"""SequenceClassificationTask: model built in configure_model, fp32 metrics, metric values, optimizer, learning."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning as L
import pytest
import torch
from torch import nn
from torchmetrics import Metric

from lightning_zero.app.data.movie_reviews import MovieReviewsDataModule
from lightning_zero.app.tasks import base
from lightning_zero.app.tasks.classification import SequenceClassificationTask
from lightning_zero.app.tasks.optimization import decay_parameter_names, parameter_groups
from lightning_zero.errors import ZeroConfigError
from lightning_zero.hardware import cpu_precision
from tests.helpers.runif import RunIf

MINILM = "sentence-transformers/all-MiniLM-L6-v2"


def _metric_states(task: SequenceClassificationTask) -> dict[str, Any]:
    states = {}
    for name, module in task.named_modules():
        if isinstance(module, Metric):
            states.update({f"{name}.{key}": value for key, value in module.metric_state.items()})
    return states


def _tiny_task(**kwargs: Any) -> Any:
    task = SequenceClassificationTask(model="shape:tiny-deberta-v2", tokenizer=MINILM, **kwargs)
    task.configure_model()
    return task


# --- construction -------------------------------------------------------------------------------------------


def test_model_is_built_once_in_configure_model_with_the_tokenizer_vocabulary() -> None:
    task = SequenceClassificationTask(model="shape:tiny-deberta-v2", tokenizer=MINILM, num_labels=3)
    assert task.model is None  # nothing built in __init__ (ZeRO-3 builds it partitioned later)
    task.configure_model()
    model = task.model
    assert model is not None and model.training
    task.configure_model()
    assert task.model is model
    assert model.get_input_embeddings().weight.shape[0] == 30522  # len(MiniLM tokenizer), not DeBERTa's 128100
    assert model.config.num_labels == 3 and model.config.pad_token_id == 0
    assert task.hparams["num_labels"] == 3 and task.hparams["model"] == "shape:tiny-deberta-v2"


_IMPORTED_IN_SETUP = """
import sys
from lightning_zero.app.tasks.causal_lm import CausalLMTask
from lightning_zero.app.tasks.classification import SequenceClassificationTask
from lightning_zero.app.tasks.seq2seq import Seq2SeqTask
tasks = {
    "deberta_v2": SequenceClassificationTask(model="shape:tiny-deberta-v2"),
    "t5": Seq2SeqTask(model="shape:tiny-t5"),
    "gpt2": CausalLMTask(model="shape:tiny-gpt2"),
}
for name, task in tasks.items():
    module = f"transformers.models.{name}.modeling_{name}"
    assert module not in sys.modules, module
    task.setup("fit")
    assert module in sys.modules, module
"""


@pytest.mark.multiprocess
def test_setup_imports_the_modeling_module_that_zero3_would_import_inside_zero_init() -> None:
    # transformers 5.17's DeBERTa-v2 module runs torch.jit.script on import, which fails inside zero.Init.
    result = subprocess.run([sys.executable, "-c", _IMPORTED_IN_SETUP], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


def test_bad_arguments_are_one_line_errors() -> None:
    with pytest.raises(ZeroConfigError, match="set `tokenizer`"):
        SequenceClassificationTask(model="shape:tiny-deberta-v2").configure_model()
    with pytest.raises(ZeroConfigError, match="num_labels must be at least 2"):
        SequenceClassificationTask(num_labels=1)
    with pytest.raises(ZeroConfigError, match="configure_model"):
        SequenceClassificationTask()(input_ids=torch.ones(1, 2, dtype=torch.long))


def _with_data(task: SequenceClassificationTask, data_tokenizer: str) -> SequenceClassificationTask:
    task._trainer = SimpleNamespace(datamodule=MovieReviewsDataModule(tokenizer=data_tokenizer))  # type: ignore[assignment]
    task.setup("fit")
    return task


def test_an_unset_tokenizer_is_the_data_modules_and_another_tokenizer_is_refused() -> None:
    task = _with_data(SequenceClassificationTask(model="shape:tiny-deberta-v2"), "all-MiniLM-L6-v2")
    assert task.tokenizer_name == "all-MiniLM-L6-v2" and "tokenizer" not in task.hparams_initial  # not rewritten
    task.configure_model()  # the shape takes the data module's vocabulary
    model: Any = task.model
    assert model is not None and model.get_input_embeddings().weight.shape[0] == 30522
    same = _with_data(SequenceClassificationTask(model=MINILM, tokenizer=MINILM), "all-MiniLM-L6-v2")
    assert same.hparams_initial["tokenizer"] == MINILM  # another spelling of the same tokenizer is accepted
    with pytest.raises(ZeroConfigError, match=r"set the tokenizer once, under data\.init_args\.tokenizer"):
        _with_data(SequenceClassificationTask(model=MINILM, tokenizer=MINILM), "bert-base-uncased")


# --- metrics ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("convert", [lambda m: m.to(torch.bfloat16), lambda m: m.bfloat16(), lambda m: m.half()])
def test_metric_states_stay_fp32_when_the_module_is_cast(convert: Callable[[nn.Module], object]) -> None:
    task = _tiny_task()
    convert(task)
    assert task.model.classifier.weight.dtype in (torch.bfloat16, torch.float16)  # the model was cast
    states = _metric_states(task)
    assert states["val_loss.mean_value"].dtype == torch.float32
    assert all(value.dtype in (torch.float32, torch.int64) for value in states.values()), states
    # accumulate bf16 losses: fp32 state keeps the digits a bf16 state would round away
    for _ in range(3):
        task.update_metrics(torch.randn(4, 2, dtype=torch.bfloat16), torch.ones(4, dtype=torch.long), torch.tensor(1.0))
    task.update_metrics(
        torch.randn(4, 2, dtype=torch.bfloat16), torch.ones(4, dtype=torch.long), torch.tensor(1.0 + 2**-10)
    )
    assert task.val_loss.compute().item() == pytest.approx(1.0 + 2**-12, abs=1e-7)
    assert [name for name, _ in task.named_children()] == ["val_metrics", "val_loss", "model"]


def _manual_binary_f1(preds: torch.Tensor, labels: torch.Tensor) -> float:
    tp = int(((preds == 1) & (labels == 1)).sum())
    fp = int(((preds == 1) & (labels == 0)).sum())
    fn = int(((preds == 0) & (labels == 1)).sum())
    return 2 * tp / (2 * tp + fp + fn)


def _manual_macro_f1(preds: torch.Tensor, labels: torch.Tensor, classes: int) -> float:
    scores = []
    for c in range(classes):
        tp = int(((preds == c) & (labels == c)).sum())
        fp = int(((preds == c) & (labels != c)).sum())
        fn = int(((preds != c) & (labels == c)).sum())
        scores.append(2 * tp / (2 * tp + fp + fn))
    return sum(scores) / classes


@pytest.mark.parametrize("num_labels", [2, 3])
def test_metrics_match_a_manual_computation(num_labels: int) -> None:
    generator = torch.Generator().manual_seed(num_labels)
    task = SequenceClassificationTask(num_labels=num_labels)
    batches = [
        (torch.randn(n, num_labels, generator=generator), torch.randint(0, num_labels, (n,), generator=generator))
        for n in (37, 50, 13)
    ]
    losses = [torch.tensor(0.5), torch.tensor(1.0), torch.tensor(2.0)]
    for (logits, labels), loss in zip(batches, losses, strict=True):
        task.update_metrics(logits, labels, loss)
    preds = torch.cat([logits.argmax(-1) for logits, _ in batches])
    labels = torch.cat([labels for _, labels in batches])
    values = task.val_metrics.compute()
    assert set(values) == {"val_acc", "val_f1"}
    assert values["val_acc"].item() == pytest.approx((preds == labels).float().mean().item(), abs=1e-6)
    expected_f1 = _manual_binary_f1(preds, labels) if num_labels == 2 else _manual_macro_f1(preds, labels, num_labels)
    assert values["val_f1"].item() == pytest.approx(expected_f1, abs=1e-6)
    # val_loss is the mean over examples, not over batches
    assert task.val_loss.compute().item() == pytest.approx((37 * 0.5 + 50 * 1.0 + 13 * 2.0) / 100, abs=1e-6)


# --- optimizer ----------------------------------------------------------------------------------------------


def test_no_decay_for_biases_and_norms() -> None:
    task = _tiny_task()
    assert task.model is not None
    groups = parameter_groups(task.model, 0.05)
    decayed = {id(p) for p in groups[0]["params"]}
    names = {name for name, p in task.model.named_parameters() if id(p) in decayed}
    assert groups[0]["weight_decay"] == 0.05 and groups[1]["weight_decay"] == 0.0
    assert "classifier.weight" in names and not any("bias" in n or "LayerNorm" in n for n in names)
    assert sum(len(g["params"]) for g in groups) == len(list(task.model.parameters()))


def test_one_no_decay_rule_for_every_tasks_model() -> None:
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

    from lightning_zero.app.models.loading import build_model

    gpt2 = decay_parameter_names(build_model(AutoModelForCausalLM, "shape:tiny-gpt2", vocab_size=64))
    assert "transformer.h.0.attn.c_attn.weight" in gpt2 and "transformer.h.0.ln_1.weight" not in gpt2
    t5 = decay_parameter_names(build_model(AutoModelForSeq2SeqLM, "shape:tiny-t5", vocab_size=64))
    assert "encoder.block.0.layer.0.SelfAttention.q.weight" in t5
    assert not any("layer_norm" in name for name in t5)  # T5's own norm class, found by name


def test_optimizer_is_adamw_with_linear_warmup_and_decay_per_step(monkeypatch: pytest.MonkeyPatch) -> None:
    task = _tiny_task(learning_rate=1e-3, warmup_ratio=0.1)
    monkeypatch.setattr(base, "training_steps", lambda module: 100)
    config = task.configure_optimizers()
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
    assert type(optimizer) is torch.optim.AdamW and config["lr_scheduler"]["interval"] == "step"
    assert optimizer.defaults["weight_decay"] == 0.01  # the task's, so DeepSpeed's `auto` fills the right value
    rates = []
    for _ in range(100):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert rates[0] == 0.0 and rates[10] == pytest.approx(1e-3) and rates[5] == pytest.approx(5e-4)
    assert rates[55] == pytest.approx(1e-3 * 45 / 90) and optimizer.param_groups[0]["lr"] == 0.0


def test_unknown_number_of_training_steps_is_an_error() -> None:
    from lightning_zero.app.tasks.causal_lm import CausalLMTask

    for task in (_tiny_task(), CausalLMTask()):
        task.model = task.model or torch.nn.Linear(2, 2)
        with pytest.raises(ZeroConfigError, match="number of training steps is unknown"):
            task.configure_optimizers()


# --- learning -----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_minilm_learns_movie_review_sentiment_in_60_steps(tmp_path: Path) -> None:
    L.seed_everything(0)
    data = MovieReviewsDataModule(
        limit_train=960, limit_val=192, max_length=48, batch_size=16, eval_batch_size=64, bucket_by_length=True
    )
    task = SequenceClassificationTask(model=MINILM, learning_rate=2e-4, warmup_ratio=0.1)
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=60, precision=cpu_precision().precision,  # type: ignore[arg-type]
        logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        default_root_dir=tmp_path,
    )  # fmt: skip
    before = trainer.validate(task, data, verbose=False)[0]
    trainer.fit(task, data)
    after = {key: value.item() for key, value in trainer.callback_metrics.items()}
    labels = data.datasets["validation"].labels
    majority = max(labels.count(0), labels.count(1)) / len(labels)
    assert trainer.global_step == 60
    assert after["val_loss"] < before["val_loss"] - 0.05, (before, after)
    assert after["val_acc"] > majority + 0.05, (majority, before, after)
    assert {"train_loss", "val_loss", "val_acc", "val_f1"} <= set(after)


def test_a_16_bit_checkpoint_loads_in_fp32(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from lightning_zero.app.models.loading import build_model

    model: Any = build_model(AutoModelForCausalLM, "shape:tiny-gpt2", vocab_size=64)
    model.to(torch.float16).save_pretrained(tmp_path)
    loaded = build_model(AutoModelForCausalLM, str(tmp_path))
    assert {p.dtype for p in loaded.parameters()} == {torch.float32}, "the optimizer's weights must be fp32"


def test_zero3_moves_the_tasks_metrics_where_deepspeed_left_the_module_alone() -> None:
    from lightning_zero.strategies.deepspeed import metrics_to_device

    task = SequenceClassificationTask(model="shape:tiny-bert", num_labels=2)
    metrics_to_device(task, torch.device("meta"))
    states = [metric.tp for metric in task.val_metrics.values() if hasattr(metric, "tp")]
    assert states and all(state.device.type == "meta" for state in states)


@RunIf(min_cuda_gpus=1)
def test_zero3_validates_on_a_gpu(tmp_path: Path) -> None:
    data = MovieReviewsDataModule(limit_train=16, limit_val=16, max_length=32, batch_size=8)
    task = SequenceClassificationTask(model=MINILM)
    trainer = L.Trainer(
        accelerator="gpu", devices=1, strategy="zero3", precision="bf16-mixed", max_epochs=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, num_sanity_val_steps=0, default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(task, data)
    assert {"val_acc", "val_f1"} <= set(trainer.callback_metrics)
