"""A causal LM's loss without its full logits tensor.

At 2048 tokens and Llama 3's 128,256-token vocabulary, one sample's fp32 logits take 1 GiB, and autograd keeps
them (and their log-softmax) for backward. Here the output layer runs on a chunk of positions at a time, each
chunk's cross-entropy is summed, and each chunk runs under ``torch.utils.checkpoint``: backward recomputes that
chunk's logits instead of keeping them, so at most one chunk's logits exist at any time. The numbers are Hugging
Face's ``ForCausalLMLoss``: position ``t`` predicts label ``t + 1``, labels ``-100`` are not scored, fp32
cross-entropy.

Written here rather than taken from a fused-kernel package: Liger-Kernel's and Apple's Cut Cross-Entropy's
kernels are Triton (CUDA only) and would need a second code path for CPU (see the project's notes).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from lightning_zero.app.tasks.metrics import IGNORE_INDEX

#: Model types whose logits are exactly their output layer applied to the base model's last hidden state (no
#: soft-capping or scaling after it), checked against the plain loss in tests/test_losses.py.
CHUNKABLE_MODEL_TYPES = frozenset({"gpt2", "llama", "mistral", "qwen2", "qwen3"})


def supports_chunked_loss(model: nn.Module) -> bool:
    """Whether ``model`` is a Hugging Face causal LM whose loss :func:`causal_lm_nll` computes exactly."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    get_head = getattr(model, "get_output_embeddings", None)
    return model_type in CHUNKABLE_MODEL_TYPES and get_head is not None and get_head() is not None


def causal_lm_nll(
    model: Any, input_ids: Tensor, attention_mask: Tensor | None, labels: Tensor, chunk_tokens: int
) -> tuple[Tensor, Tensor]:
    """Summed fp32 negative log-likelihood of ``labels`` under ``model`` and the number of scored tokens, with
    the output layer applied ``chunk_tokens`` positions at a time (see the module docstring).

    ``model`` must pass :func:`supports_chunked_loss`.
    """
    outputs = model.base_model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    return chunked_nll(outputs.last_hidden_state, model.get_output_embeddings(), labels, chunk_tokens)


def chunked_nll(hidden: Tensor, head: nn.Module, labels: Tensor, chunk_tokens: int) -> tuple[Tensor, Tensor]:
    """Summed fp32 cross-entropy of ``head(hidden)`` against the next position's ``labels``, and the number of
    scored tokens, computing at most ``chunk_tokens`` rows of logits at a time.

    Args:
        hidden: ``[batch, length, hidden]``, the base model's last hidden state.
        head: The output layer (``[..., hidden] -> [..., vocab]``).
        labels: ``[batch, length]``, ``-100`` where nothing is scored.
        chunk_tokens: Positions per chunk of logits.
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be positive, got {chunk_tokens}")
    flat_hidden = hidden[:, :-1].reshape(-1, hidden.size(-1))
    targets = labels[:, 1:].reshape(-1).to(hidden.device)
    nll = torch.zeros((), dtype=torch.float32, device=hidden.device)
    for start in range(0, targets.numel(), chunk_tokens):
        rows = slice(start, start + chunk_tokens)
        if torch.is_grad_enabled():
            chunk = checkpoint(_chunk_nll, head, flat_hidden[rows], targets[rows], use_reentrant=False)
        else:
            chunk = _chunk_nll(head, flat_hidden[rows], targets[rows])
        nll = nll + chunk
    return nll, (targets != IGNORE_INDEX).sum()


def _chunk_nll(head: nn.Module, hidden: Tensor, targets: Tensor) -> Tensor:
    return F.cross_entropy(head(hidden).float(), targets, ignore_index=IGNORE_INDEX, reduction="sum")
