"""The validation metrics the tasks share: token-level loss and perplexity, BLEU, classification accuracy/F1.

Every metric here is a torchmetrics state summed over ranks, so a value is the same under DDP and any ZeRO stage
for the same predictions, whatever the batch split.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import Accuracy, F1Score, Metric, MetricCollection
from torchmetrics.text import SacreBLEUScore

IGNORE_INDEX = -100


def token_nll(logits: Tensor, labels: Tensor, shift: bool) -> tuple[Tensor, Tensor]:
    """Summed token negative log-likelihood (fp32) and the number of scored tokens.

    Args:
        logits: ``[batch, length, vocab]``.
        labels: ``[batch, length]``, ``-100`` where nothing is scored.
        shift: ``True`` for causal LMs (position t predicts token t+1), ``False`` when labels are aligned.
    """
    if shift:
        logits, labels = logits[:, :-1], labels[:, 1:]
    flat_logits = logits.reshape(-1, logits.size(-1)).float()
    flat_labels = labels.reshape(-1)
    nll = F.cross_entropy(flat_logits, flat_labels, ignore_index=IGNORE_INDEX, reduction="sum")
    return nll, (flat_labels != IGNORE_INDEX).sum()


class TokenPerplexity(Metric):
    """Mean token loss and perplexity over all ranks: float64 sums of nll and token counts."""

    full_state_update = False
    higher_is_better = False
    nll_sum: Tensor
    tokens: Tensor

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("nll_sum", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("tokens", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, nll_sum: Tensor, tokens: Tensor) -> None:
        """Add a batch's summed nll and token count (from :func:`token_nll`)."""
        # Out of place: states re-created under inference mode must not be updated in place outside it.
        self.nll_sum = self.nll_sum + nll_sum.detach().to(torch.float64)
        self.tokens = self.tokens + tokens.detach().to(torch.float64)

    def compute(self) -> dict[str, Tensor]:
        """``{"loss": mean token nll, "perplexity": exp(loss)}``."""
        loss = self.nll_sum / self.tokens.clamp(min=1.0)
        return {"loss": loss, "perplexity": torch.exp(loss)}


def bleu_metric() -> SacreBLEUScore:
    """Corpus BLEU as SacreBLEU computes it (13a tokenisation; sacrebleu is a dependency)."""
    return SacreBLEUScore(tokenize="13a")


def classification_metrics(num_labels: int, prefix: str = "val_") -> MetricCollection:
    """Accuracy and F1 (binary for two labels, macro-averaged multiclass otherwise), on predicted labels."""
    if num_labels == 2:
        metrics: dict[str, Metric | MetricCollection] = {"acc": Accuracy(task="binary"), "f1": F1Score(task="binary")}
    else:
        metrics = {
            "acc": Accuracy(task="multiclass", num_classes=num_labels, average="micro"),
            "f1": F1Score(task="multiclass", num_classes=num_labels, average="macro"),
        }
    return MetricCollection(metrics, prefix=prefix)
