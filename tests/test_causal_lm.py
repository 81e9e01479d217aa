"""Causal LM: block packing, offline and ``datasets`` text, learning, and metric parity across strategies.

The parity test runs this file as a 2-process worker (``python tests/test_causal_lm.py parity OUT ...``): the
same fixed predictions go through the tasks' real metric code (token perplexity, SacreBLEU) under DDP and
ZeRO-2/ZeRO-3, and the numbers must be identical. What can differ between them, and what the worker guards:
DeepSpeed's precision plugin casts every floating tensor of a batch to bf16 (DDP does not), so the worker's
batches carry only integer indices; ``*-true`` precision casts metric states with ``module.to(dtype)``.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # also run as a worker script

import pytest
import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch.utils.data import Dataset

from lightning_zero.app.data.corpora import corpus_texts
from lightning_zero.app.data.text_corpus import TextBlocksDataModule, pack_blocks, split_texts
from lightning_zero.app.tasks.causal_lm import CausalLMTask
from lightning_zero.app.tasks.metrics import TokenPerplexity, bleu_metric, token_nll
from lightning_zero.errors import ZeroConfigError
from tests.helpers.runif import RunIf
from tests.helpers.trainer import quiet_trainer

TOKENIZER = "bpe:chitchat:1024"
WORKER_TIMEOUT_S = 240


pytestmark = pytest.mark.usefixtures("one_thread")  # cache_dir and one_thread: tests/conftest.py


# --- packing and text ----------------------------------------------------------------------------------------


def test_pack_blocks_concatenates_with_eos_and_drops_the_tail() -> None:
    blocks = pack_blocks([[1, 2, 3], [4], [5, 6, 7, 8, 9]], block_size=4, eos_id=0)
    assert blocks.tolist() == [[1, 2, 3, 0], [4, 0, 5, 6], [7, 8, 9, 0]]
    assert pack_blocks([[1, 2, 3], [4], [5, 6, 7, 8, 9]], block_size=5, eos_id=0).tolist() == [
        [1, 2, 3, 0, 4],
        [0, 5, 6, 7, 8],
    ]  # the tail [9, 0] is dropped
    assert pack_blocks(iter([[1] * 100]), block_size=10, eos_id=0, limit=3).shape == (3, 10)
    assert pack_blocks([[1]], block_size=4, eos_id=0).shape == (0, 4)
    with pytest.raises(ZeroConfigError, match="block_size"):
        pack_blocks([[1]], block_size=1, eos_id=0)


def test_rotten_tomatoes_reviews_without_plots() -> None:
    texts = list(corpus_texts("rotten-tomatoes"))
    assert len(texts) == 12_808
    train, val = split_texts(texts, 0.1, seed=0)
    assert len(val) == 1281 and len(train) == 12_808 - 1281
    assert (train, val) == split_texts(texts, 0.1, seed=0)


@pytest.mark.parametrize("corpus", ["chitchat", "rotten-tomatoes"])
def test_text_blocks_from_shipped_corpora(corpus: str, cache_dir: str) -> None:
    dm = TextBlocksDataModule(
        corpus=corpus, tokenizer=TOKENIZER, tokenizer_cache_dir=cache_dir, block_size=32, limit_train=20, limit_val=5
    )
    dm.setup()
    assert dm.train_blocks is not None and dm.train_blocks.shape == (20, 32)
    assert dm.val_blocks is not None and dm.val_blocks.shape == (5, 32)
    batch = next(iter(dm.val_dataloader()))
    assert torch.equal(batch["input_ids"], batch["labels"]) and batch["input_ids"].dtype == torch.long
    eos = dm.tokenizer.eos_token_id
    assert (dm.train_blocks == eos).any()  # documents are separated by EOS
    decoded = cast(str, dm.tokenizer.decode(dm.val_blocks[0], skip_special_tokens=True))
    assert len(decoded.split()) > 5


@RunIf(datasets=True)
def test_text_blocks_through_datasets_on_local_files(tmp_path: Path, cache_dir: str) -> None:
    (tmp_path / "train.txt").write_text("the quick brown fox jumps over the lazy dog\n" * 40)
    (tmp_path / "valid.txt").write_text("hello there how are you doing today\n" * 10)
    dm = TextBlocksDataModule(
        corpus="text",
        data_files={"train": str(tmp_path / "train.txt"), "validation": str(tmp_path / "valid.txt")},
        tokenizer=TOKENIZER,
        tokenizer_cache_dir=cache_dir,
        block_size=16,
    )
    dm.setup()
    assert dm.val_blocks is not None and dm.train_blocks is not None
    assert "hello there" in dm.tokenizer.decode(dm.val_blocks[0]) and "fox" not in dm.tokenizer.decode(dm.val_blocks[0])
    assert dm.train_blocks.shape[1] == 16 and len(dm.train_blocks) > len(dm.val_blocks)


# --- loss and perplexity ---------------------------------------------------------------------------------


def test_token_nll_matches_the_models_own_loss(cache_dir: str) -> None:
    task = CausalLMTask(model="shape:tiny-gpt2", tokenizer=TOKENIZER, tokenizer_cache_dir=cache_dir)
    task.configure_model()
    assert task.model is not None
    ids = torch.randint(0, 1024, (3, 12))
    labels = ids.clone()
    labels[0, :4] = -100
    output = task.model(input_ids=ids, labels=labels)
    nll, tokens = token_nll(output.logits, labels, shift=True)
    assert int(tokens) == 3 * 11 - 3
    assert torch.allclose(nll / tokens, output.loss, atol=1e-5)
    assert cast(Any, task.model).get_input_embeddings().weight.shape[0] == 1024  # vocab_size = len(tokenizer)


@pytest.mark.parametrize("model", ["shape:tiny-llama", "shape:tiny-gpt2"])
def test_the_task_computes_its_loss_in_chunks_when_asked(model: str, cache_dir: str) -> None:
    task = CausalLMTask(model=model, tokenizer=TOKENIZER, tokenizer_cache_dir=cache_dir, loss_chunk_tokens=16)
    task.configure_model()
    assert task.model is not None and task.chunked_loss
    ids = torch.randint(0, 1024, (2, 24))
    torch.manual_seed(0)
    loss = task.training_step({"input_ids": ids, "labels": ids}, 0)
    torch.manual_seed(0)
    assert loss.item() == pytest.approx(task.model(input_ids=ids, labels=ids).loss.item(), abs=1e-6)

    plain = CausalLMTask(model=model, tokenizer=TOKENIZER, tokenizer_cache_dir=cache_dir)
    plain.configure_model()
    assert not plain.chunked_loss  # off by default: golden losses and FSDP runs keep the model's own logits


def test_fsdp_refuses_the_chunked_loss_in_one_line(cache_dir: str) -> None:
    task = CausalLMTask(tokenizer=TOKENIZER, tokenizer_cache_dir=cache_dir, loss_chunk_tokens=16)
    task.trainer = cast(Any, SimpleNamespace(strategy=ModelParallelStrategy()))
    with pytest.raises(ZeroConfigError, match="loss_chunk_tokens: null or use a DeepSpeed"):
        task.setup("fit")


def test_a_shape_takes_a_vocabulary_larger_than_its_tokenizer(cache_dir: str) -> None:
    common: dict[str, Any] = {"tokenizer": TOKENIZER, "tokenizer_cache_dir": cache_dir}
    task = CausalLMTask(model="shape:tiny-llama", vocab_size=1100, **common)
    task.configure_model()
    assert cast(Any, task.model).get_output_embeddings().weight.shape == (1100, 64)
    with pytest.raises(ZeroConfigError, match="smaller than the tokenizer's 1024"):
        CausalLMTask(model="shape:tiny-llama", vocab_size=1000, **common).configure_model()
    with pytest.raises(ZeroConfigError, match="shapes only"):
        CausalLMTask(model="gpt2", vocab_size=1100, **common)
    with pytest.raises(ZeroConfigError, match="loss_chunk_tokens"):
        CausalLMTask(loss_chunk_tokens=0, **common)


def test_perplexity_weights_tokens_not_batches() -> None:
    metric = TokenPerplexity()
    metric.update(torch.tensor(10.0), torch.tensor(10))
    metric.update(torch.tensor(1.0), torch.tensor(1))  # a short batch must not count as much as a long one
    values = metric.compute()
    assert values["loss"].item() == pytest.approx(1.0)
    assert values["perplexity"].item() == pytest.approx(math.e)


def test_metric_states_keep_their_dtype_when_the_module_is_cast() -> None:
    task = CausalLMTask()
    task.model = torch.nn.Linear(2, 2)
    task.to(torch.bfloat16)  # what `*-true` precision does to the whole module
    assert task.model.weight.dtype == torch.bfloat16  # the model was cast
    assert task.val_perplexity.nll_sum.dtype == torch.float64  # the metric's float64 sums were not
    assert set(task._modules) == {"model", "val_perplexity"}  # both attributes are back in place


def test_causal_lm_learns_on_chitchat(cache_dir: str) -> None:
    import lightning as L

    L.seed_everything(0)
    common: dict[str, Any] = {"tokenizer": TOKENIZER, "tokenizer_cache_dir": cache_dir}
    dm = TextBlocksDataModule(block_size=64, batch_size=16, limit_train=800, limit_val=32, **common)
    task = CausalLMTask(model="shape:tiny-gpt2", learning_rate=3e-3, **common)
    trainer = quiet_trainer(
        devices=1,
        max_steps=30,
        num_sanity_val_steps=0,
    )
    before = trainer.validate(task, dm, verbose=False)[0]["val_loss"]
    trainer.fit(task, dm)
    after = trainer.validate(task, dm, verbose=False)[0]["val_loss"]
    assert before == pytest.approx(math.log(1024), abs=0.3)  # random init: close to uniform
    assert after < before - 0.5, (before, after)
    assert trainer.callback_metrics["val_ppl"].item() == pytest.approx(math.exp(after), rel=1e-4)


# --- the same metrics under DDP and ZeRO ---------------------------------------------------------------

_VOCAB, _LENGTH, _ITEMS = 11, 6, 8
_WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "away"]


def _fixed_item(index: int) -> tuple[torch.Tensor, torch.Tensor, str, str]:
    """Logits, labels, a predicted and a reference sentence, the same for a given index on any rank."""
    g = torch.Generator().manual_seed(index)
    logits = torch.randn(_LENGTH, _VOCAB, generator=g, dtype=torch.float32) * 3
    labels = torch.randint(0, _VOCAB, (_LENGTH,), generator=g)
    labels[: index % 3] = -100
    reference = [_WORDS[j] for j in torch.randint(0, len(_WORDS), (8,), generator=g)]
    prediction = list(reference)
    prediction[index % 8] = "zebra"
    return logits, labels, " ".join(prediction[: 5 + index % 4]), " ".join(reference)


def _reference_metrics() -> dict[str, float]:
    perplexity, bleu = TokenPerplexity(), bleu_metric()
    for index in range(_ITEMS):
        logits, labels, prediction, reference = _fixed_item(index)
        perplexity.update(*token_nll(logits[None], labels[None], shift=True))
        bleu.update([prediction], [[reference]])
    values = perplexity.compute()
    return {
        "val_loss": values["loss"].item(),
        "val_ppl": values["perplexity"].item(),
        "val_bleu": bleu.compute().item(),
    }


def _parity_worker(out: str, runs: list[str]) -> None:
    from torch.utils.data import DataLoader

    import lightning_zero  # noqa: F401  (registers zero2/zero3)
    from lightning_zero.app.tasks.seq2seq import Seq2SeqTask

    class FixedPredictions(Seq2SeqTask):
        """The real task's metric path fed with fixed predictions; the batch holds only indices."""

        def configure_model(self) -> None:
            if self.model is None:
                self.model = torch.nn.Linear(2, 2)

        def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:  # type: ignore[override]
            items = [_fixed_item(int(i)) for i in batch]
            logits = torch.stack([item[0] for item in items])
            labels = torch.stack([item[1] for item in items])
            self.val_perplexity.update(*token_nll(logits, labels, shift=True))
            self.update_bleu([item[2] for item in items], [item[3] for item in items])

        def val_dataloader(self) -> DataLoader:
            return DataLoader(cast(Dataset[torch.Tensor], torch.arange(_ITEMS)), batch_size=2)

    results = {}
    for run in runs:
        strategy, precision = run.split("@")
        trainer = quiet_trainer(
            devices=2,
            strategy=strategy,
            precision=precision,
        )
        trainer.validate(FixedPredictions(), verbose=False)
        results[run] = {key: value.item() for key, value in trainer.callback_metrics.items()}
    if trainer.global_rank == 0:
        Path(out).write_text(json.dumps(results))


def run_worker(args: list[str], timeout: float = WORKER_TIMEOUT_S) -> str:
    """Run this file as a multi-process worker under a hard time-out that kills its whole process group."""
    from tests.helpers.launch import run_script  # the pytest process only: workers run this file as a script

    return run_script(Path(__file__), *args, timeout=timeout)


@pytest.mark.multiprocess
def test_perplexity_and_bleu_identical_under_ddp_and_zero(tmp_path: Path) -> None:
    out = tmp_path / "metrics.json"
    runs = ["ddp@bf16-mixed", "zero2@bf16-mixed", "zero3@bf16-mixed", "ddp@bf16-true", "zero3@bf16-true"]
    run_worker(["parity", str(out), *runs])
    results = json.loads(out.read_text())
    reference = _reference_metrics()
    assert 0.1 < reference["val_bleu"] < 0.9 and reference["val_loss"] > 1.0  # the data exercise both metrics
    for run in runs:
        assert results[run] == results["ddp@bf16-mixed"], run  # bit-identical
        for key, value in reference.items():
            assert results[run][key] == pytest.approx(value, rel=1e-6), (run, key)


if __name__ == "__main__":
    if sys.argv[1] == "parity":
        _parity_worker(sys.argv[2], sys.argv[3:])
