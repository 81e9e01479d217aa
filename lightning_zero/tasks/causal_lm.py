"""Causal language modelling (GPT-2 and friends) with perplexity, for any ZeRO strategy.

The model is built in ``configure_model`` so that under ZeRO-3 DeepSpeed constructs it already partitioned.
Loss and perplexity come from one token-level reduction: summed negative log-likelihood (computed in fp32)
and a token count, summed over ranks by a torchmetrics state. ``exp(total nll / total tokens)`` is then the
same number under DDP and every ZeRO stage for the same predictions, whatever the batch split.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn
from transformers import AutoModelForCausalLM

from lightning_zero.tasks.base import LanguageTask, build_language_model
from lightning_zero.tasks.metrics import token_nll


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
    ) -> None:
        super().__init__()
        self.save_hyperparameters()

    def build_network(self) -> nn.Module:
        """The causal LM (a shape gets the tokenizer's vocabulary and special ids)."""
        return build_language_model(self.auto_class, self.hparams["model"], self.tokenizer)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """Logits ``[batch, length, vocab]``."""
        assert self.model is not None, "configure_model() has not run"
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits

    def _nll(self, batch: dict[str, Any]) -> tuple[Tensor, Tensor]:
        logits = self(batch["input_ids"], batch.get("attention_mask"))
        return token_nll(logits, batch["labels"], shift=True)

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self.update_perplexity(*self._nll(batch))

    def update_perplexity(self, nll_sum: Tensor, tokens: Tensor) -> None:
        """Feed one batch's summed nll and token count to the validation perplexity."""
        self.val_perplexity.update(nll_sum, tokens)
