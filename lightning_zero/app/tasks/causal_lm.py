"""Causal language modelling (GPT-2 and friends) with perplexity, for any ZeRO strategy.

The model is built in ``configure_model`` so that under ZeRO-3 DeepSpeed constructs it already partitioned.
Loss and perplexity come from one token-level reduction: summed negative log-likelihood (computed in fp32)
and a token count, summed over ranks by a torchmetrics state. ``exp(total nll / total tokens)`` is then the
same number under DDP and every ZeRO stage for the same predictions, whatever the batch split.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn
from transformers import AutoModelForCausalLM

from lightning_zero.app.models.shapes import is_shape
from lightning_zero.app.tasks.base import LanguageTask, build_language_model
from lightning_zero.app.tasks.losses import causal_lm_nll, supports_chunked_loss
from lightning_zero.app.tasks.metrics import token_nll
from lightning_zero.errors import ZeroConfigError


class CausalLMTask(LanguageTask):
    """Causal LM training with token-level loss and perplexity.

    Args:
        model: ``shape:NAME`` (random init, e.g. ``shape:gpt2-xl``), a local folder or a hub name (``gpt2-xl``).
        tokenizer: ``bpe:CORPUS[:VOCAB]``, a local folder, a shipped model name or a hub name; the data module
            must use the same one. For shapes the vocabulary size is the tokenizer's length.
        tokenizer_cache_dir: Where a trained BPE is kept; ``~/.cache/lightning-zero/tokenizers`` if unset.
        learning_rate: Peak AdamW learning rate.
        weight_decay: AdamW weight decay (not on biases and norms).
        warmup_ratio: Share of the training steps spent warming the learning rate up linearly.
        vocab_size: For shapes, the model's vocabulary size (at least the tokenizer's length), e.g. 128256 for a
            Llama 3 shape whose output layer should be the published model's; ``None``: the tokenizer's length.
        loss_chunk_tokens: Positions whose logits are computed at a time for the loss (each chunk recomputed in
            backward): the full ``[tokens, vocab]`` logits never exist. Same loss and gradients as the model's
            own, up to the order of float sums; applies to GPT-2, Llama, Mistral and Qwen 2/3 models, others use
            their own logits. Not with FSDP strategies, which gather the output layer only inside the whole
            model's forward. ``None`` (the default): the model's own logits.
    """

    auto_class = AutoModelForCausalLM

    # LightningCLI reads this signature: the parameters (and their docs) shared with the other language task stay.
    def __init__(
        self,
        model: str = "shape:tiny-gpt2",
        tokenizer: str = "bpe:chitchat",
        tokenizer_cache_dir: str | None = None,
        learning_rate: float = 5e-4,
        weight_decay: float = 0.0,
        warmup_ratio: float = 0.0,
        vocab_size: int | None = None,
        loss_chunk_tokens: int | None = None,
    ) -> None:
        super().__init__()
        if vocab_size is not None and not is_shape(model):
            raise ZeroConfigError(f"`vocab_size` applies to shapes only, not to {model!r}: remove `vocab_size`.")
        if loss_chunk_tokens is not None and loss_chunk_tokens < 1:
            raise ZeroConfigError(
                f"`loss_chunk_tokens` must be a positive number of positions, got {loss_chunk_tokens}: e.g. 1024,"
                " or null for the model's own logits."
            )
        self.save_hyperparameters()
        self.chunked_loss = False

    def setup(self, stage: str) -> None:
        """Refuse the chunked loss under FSDP, before anything is built."""
        super().setup(stage)
        if self.hparams.get("loss_chunk_tokens") is not None and isinstance(
            self.trainer.strategy, FSDPStrategy | ModelParallelStrategy
        ):
            raise ZeroConfigError(
                f"`loss_chunk_tokens` does not work with {type(self.trainer.strategy).__name__} (FSDP gathers the"
                " output layer only inside the whole model's forward): set model.init_args.loss_chunk_tokens: null"
                " or use a DeepSpeed strategy."
            )

    def build_network(self) -> nn.Module:
        """The causal LM (a shape gets the tokenizer's special ids, and its vocabulary unless ``vocab_size``)."""
        vocab_size = self.hparams.get("vocab_size")
        if vocab_size is not None and vocab_size < len(self.tokenizer):
            raise ZeroConfigError(
                f"`vocab_size: {vocab_size}` is smaller than the tokenizer's {len(self.tokenizer)} tokens: raise it"
                " or remove it."
            )
        overrides = {} if vocab_size is None else {"vocab_size": vocab_size}
        model = build_language_model(self.auto_class, self.hparams["model"], self.tokenizer, **overrides)
        self.chunked_loss = self.hparams.get("loss_chunk_tokens") is not None and supports_chunked_loss(model)
        if self.hparams.get("loss_chunk_tokens") is not None and not self.chunked_loss:
            rank_zero_info(
                f"Loss from the model's full logits: chunked loss is not known to be exact for {type(model).__name__}."
            )
        return model

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """Logits ``[batch, length, vocab]``."""
        assert self.model is not None, "configure_model() has not run"
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits

    def _nll(self, batch: dict[str, Any]) -> tuple[Tensor, Tensor]:
        if self.chunked_loss:
            chunk_tokens = self.hparams["loss_chunk_tokens"]
            return causal_lm_nll(
                self.model, batch["input_ids"], batch.get("attention_mask"), batch["labels"], chunk_tokens
            )
        logits = self(batch["input_ids"], batch.get("attention_mask"))
        return token_nll(logits, batch["labels"], shift=True)

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self.update_perplexity(*self._nll(batch))

    def update_perplexity(self, nll_sum: Tensor, tokens: Tensor) -> None:
        """Feed one batch's summed nll and token count to the validation perplexity."""
        self.val_perplexity.update(nll_sum, tokens)
