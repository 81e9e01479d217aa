"""A seq2seq chatbot (BlenderBot, BART, T5, ...) trained teacher-forced and validated by generating replies.

The network is built in ``configure_model``, so under ZeRO-3 DeepSpeed constructs it partitioned. Validation
generates with beam search; under ZeRO-3 or FSDP with more than one process, ``generate`` runs with
``synced_gpus=True`` so that every rank keeps taking part in the parameter gathers until the slowest rank's
beams are done. BLEU is torchmetrics' ``SacreBLEUScore``, with fp32 states summed over ranks.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn
from transformers import AutoModelForSeq2SeqLM

from lightning_zero.app.data.tokenizers import special_ids
from lightning_zero.app.models.loading import build_model
from lightning_zero.app.models.shapes import is_shape
from lightning_zero.app.tasks.base import LanguageTask, build_language_model
from lightning_zero.app.tasks.metrics import IGNORE_INDEX, bleu_metric, token_nll
from lightning_zero.internals import attached_trainer


def needs_synced_generation(trainer: Any) -> bool:
    """Whether ``generate`` must keep ranks in lock-step: parameters sharded (ZeRO-3, FSDP) on >1 process."""
    if trainer is None or trainer.world_size <= 1:
        return False
    strategy = trainer.strategy
    if getattr(strategy, "zero_stage_3", False):
        return True
    from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

    return is_deepspeed_zero3_enabled() or isinstance(strategy, FSDPStrategy | ModelParallelStrategy)


def shift_right(labels: Tensor, start_id: int, pad_id: int) -> Tensor:
    """Decoder inputs for teacher forcing: the start token, then the labels but the last, -100 as padding."""
    shifted = labels.new_full(labels.shape, pad_id)
    shifted[:, 0] = start_id
    shifted[:, 1:] = labels[:, :-1].masked_fill(labels[:, :-1] == IGNORE_INDEX, pad_id)
    return shifted


class Seq2SeqTask(LanguageTask):
    """Fine-tune or train an encoder-decoder chatbot; validation reports loss, perplexity and BLEU.

    Args:
        model: ``shape:NAME`` (random init, e.g. ``shape:blenderbot-400M-distill``), a local folder, or a hub
            name (``facebook/blenderbot-400M-distill``, ``t5-large``).
        tokenizer: ``bpe:CORPUS[:VOCAB]``, a local folder, a shipped model name or a hub name; the data module
            must use the same one. For shapes the vocabulary size is the tokenizer's length.
        tokenizer_cache_dir: Where a trained BPE is kept; ``~/.cache/lightning-zero/tokenizers`` if unset.
        learning_rate: Peak AdamW learning rate.
        weight_decay: AdamW weight decay (not on biases and norms).
        warmup_ratio: Share of the training steps spent warming the learning rate up linearly.
        num_beams: Beams for generation (10 in the report).
        max_target_length: Most tokens generated per reply (64 in the report); the same value as the data
            module's (Lightning refuses different values for one hyper-parameter name).
        generate_on_validation: Generate replies and compute BLEU in validation (slow for big beams).
        num_logged_samples: Replies from the first validation batch printed by rank 0 and sent to the logger.
    """

    auto_class = AutoModelForSeq2SeqLM

    # LightningCLI reads this signature: the parameters (and their docs) shared with the other language task stay.
    def __init__(
        self,
        model: str = "shape:tiny-blenderbot",
        tokenizer: str = "bpe:chitchat",
        tokenizer_cache_dir: str | None = None,
        learning_rate: float = 5e-5,
        weight_decay: float = 0.0,
        warmup_ratio: float = 0.0,
        num_beams: int = 10,
        max_target_length: int = 64,
        generate_on_validation: bool = True,
        num_logged_samples: int = 3,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.val_bleu = bleu_metric()

    def build_network(self) -> nn.Module:
        """The encoder-decoder (a shape gets the tokenizer's vocabulary and special ids, for generation too), its
        generation config set to generate as validation does (kept in a Hugging Face export)."""
        source = self.hparams["model"]
        if is_shape(source):
            start = special_ids(self.tokenizer).bos
            model = build_language_model(self.auto_class, source, self.tokenizer, decoder_start_token_id=start)
            config: Any = model.config
            for key in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
                setattr(model.generation_config, key, getattr(config, key))  # generation reads these here
        else:
            model = build_model(self.auto_class, source)
        generation: Any = model.generation_config
        generation.num_beams = self.hparams["num_beams"]
        generation.max_new_tokens = self.hparams["max_target_length"]
        generation.min_new_tokens = 1
        if generation.num_beams > 1:  # a beam setting without beams fails save_pretrained's validation
            generation.early_stopping = True
        return model

    def forward(self, input_ids: Tensor, attention_mask: Tensor, labels: Tensor) -> Tensor:
        """Teacher-forced logits ``[batch, target length, vocab]`` (decoder inputs are the shifted labels)."""
        assert self.model is not None, "configure_model() has not run"
        config: Any = self.model.config
        decoder_input_ids = shift_right(labels, int(config.decoder_start_token_id), int(config.pad_token_id))
        return self.model(
            input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids
        ).logits

    def _nll(self, batch: dict[str, Any]) -> tuple[Tensor, Tensor]:
        logits = self(batch["input_ids"], batch["attention_mask"], batch["labels"])
        return token_nll(logits, batch["labels"], shift=False)

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self.val_perplexity.update(*self._nll(batch))
        if not self.hparams["generate_on_validation"]:
            return
        replies = self.generate_replies(batch["input_ids"], batch["attention_mask"])
        self.update_bleu(replies, batch["references"])
        if batch_idx == 0:
            self._log_samples(batch["input_ids"], replies, batch["references"])

    def update_bleu(self, replies: list[str], references: list[str]) -> None:
        """Feed generated replies and their reference replies to the validation BLEU."""
        self.val_bleu.update(replies, [[reference] for reference in references])

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()
        if self.hparams["generate_on_validation"]:
            self.log("val_bleu", self.val_bleu.compute().float(), prog_bar=True, sync_dist=True)
            self.val_bleu.reset()

    @torch.no_grad()
    def generate_replies(
        self, input_ids: Tensor, attention_mask: Tensor, num_beams: int | None = None, max_new_tokens: int | None = None
    ) -> list[str]:
        """Beam-search replies as text; in lock-step across ranks when parameters are sharded."""
        assert self.model is not None, "configure_model() has not run"
        generated = self.model.generate(  # type: ignore[operator]
            input_ids=input_ids,
            attention_mask=attention_mask,
            num_beams=num_beams or self.hparams["num_beams"],
            max_new_tokens=max_new_tokens or self.hparams["max_target_length"],
            min_new_tokens=1,
            early_stopping=True,
            synced_gpus=needs_synced_generation(attached_trainer(self)),
        )
        return [text.strip() for text in self.tokenizer.batch_decode(generated, skip_special_tokens=True)]

    def _log_samples(self, input_ids: Tensor, replies: list[str], references: list[str]) -> None:
        count = self.hparams["num_logged_samples"]
        if count <= 0 or self.global_rank != 0:
            return
        sources = self.tokenizer.batch_decode(input_ids[:count], skip_special_tokens=False)
        lines = [
            f"source: {src.replace(self.tokenizer.pad_token or '', '').strip()}\n  reply: {reply}\n  reference: {ref}"
            for src, reply, ref in zip(sources, replies, references, strict=False)
        ]
        text = "\n".join(lines)
        rank_zero_info(f"Validation samples (step {self.global_step}):\n{text}")
        add_text = getattr(getattr(self.logger, "experiment", None), "add_text", None)
        if callable(add_text):  # TensorBoard
            add_text("val_samples", text.replace("\n", "  \n"), self.global_step)
