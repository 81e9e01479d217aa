"""A causal language model's loss from its hidden states and output projection, without the full logits: with a
128k-token vocabulary, the logits of 16 samples of 2048 tokens are 16 GiB in fp32, more than the model's weights."""

from __future__ import annotations

import importlib.util

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

IGNORE_INDEX = -100


def _chunk_loss_sum(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    logits = (hidden @ weight.t()).float()
    return F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="sum")


def chunked_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk_tokens: int = 2048, shift: bool = True
) -> torch.Tensor:
    """The mean next-token cross-entropy of ``hidden @ weight.T`` against ``labels`` (``-100`` ignored), as Hugging
    Face's causal LMs compute it (``shift``: position ``t`` predicts label ``t + 1``; fp32 logits).

    On CUDA with Liger-Kernel installed, its fused linear cross-entropy computes it; elsewhere, the logits of
    ``chunk_tokens`` tokens at a time are computed, reduced and dropped, and recomputed in backward
    (``torch.utils.checkpoint``), so at most one chunk's logits exist at once. Ours, beside Liger's, because Liger's
    kernels are Triton (GPU only) and CPU runs need the same loss."""
    if shift:
        hidden, labels = hidden[..., :-1, :], labels[..., 1:]
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    flat_labels = labels.reshape(-1)
    if flat_hidden.is_cuda and importlib.util.find_spec("liger_kernel") is not None:
        return _liger_loss(flat_hidden, weight, flat_labels)
    counted = (flat_labels != IGNORE_INDEX).sum().clamp(min=1)
    total = flat_hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, flat_hidden.shape[0], chunk_tokens):
        end = start + chunk_tokens
        part = checkpoint(_chunk_loss_sum, flat_hidden[start:end], weight, flat_labels[start:end], use_reentrant=False)
        total = total + part
    return total / counted


def _liger_loss(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

    loss: torch.Tensor = LigerFusedLinearCrossEntropyLoss(ignore_index=IGNORE_INDEX)(weight, hidden, labels)
    return loss
