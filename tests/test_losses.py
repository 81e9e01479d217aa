"""The chunked causal-LM loss: the model's own loss and gradients, without the full logits tensor."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from torch import Tensor, nn
from transformers import AutoConfig, AutoModelForCausalLM

from lightning_zero.app.models.shapes import shape_config
from lightning_zero.app.tasks.losses import causal_lm_nll, supports_chunked_loss

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

VOCAB = 512
TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
# fp32 throughout. The chunked loss adds per-chunk sums where the model's loss sums once and divides: a few
# float32 roundings on a value near log(512) = 6.2 (one ulp there is 4.8e-7); gradients of the output layer are
# sums over chunks instead of one matrix product.
LOSS_ATOL = 1e-6
GRAD_ATOL, GRAD_RTOL = 1e-6, 1e-5


def _model(name: str) -> nn.Module:
    torch.manual_seed(0)
    if name.startswith("shape:"):
        config = shape_config(name, vocab_size=VOCAB)
    else:
        config = AutoConfig.for_model(name, vocab_size=VOCAB, intermediate_size=64, **TINY)
    return AutoModelForCausalLM.from_config(config).float()


def _batch() -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, VOCAB, (3, 17), generator=g)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 12:] = 0  # right padding
    labels = input_ids.clone()
    labels[1, 12:] = -100  # padding is not scored
    labels[0, :5] = -100  # nor a prompt
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def _grads(model: nn.Module) -> dict[str, Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", ["shape:tiny-llama", "shape:tiny-gpt2", "mistral", "qwen2", "qwen3"])
@pytest.mark.parametrize("chunk_tokens", [7, 1024])
def test_chunked_loss_and_gradients_are_the_models_own(name: str, chunk_tokens: int) -> None:
    model = _model(name)
    batch = _batch()
    assert supports_chunked_loss(model)

    torch.manual_seed(2)  # the same dropout masks in both (GPT-2 trains with dropout)
    reference = model(**batch).loss  # Hugging Face's ForCausalLMLoss
    reference.backward()
    reference_grads = _grads(model)
    model.zero_grad(set_to_none=True)

    torch.manual_seed(2)
    nll, tokens = causal_lm_nll(model, batch["input_ids"], batch["attention_mask"], batch["labels"], chunk_tokens)
    loss = nll / tokens
    loss.backward()

    assert int(tokens) == 3 * 16 - 4 - 5  # targets are labels[:, 1:], less the -100s among them
    assert abs(loss.item() - reference.item()) <= LOSS_ATOL
    grads = _grads(model)
    assert grads.keys() == reference_grads.keys()
    for key, grad in grads.items():
        torch.testing.assert_close(grad, reference_grads[key], atol=GRAD_ATOL, rtol=GRAD_RTOL, msg=key)


@contextmanager
def _logits_seen(head: nn.Module, sizes: dict[str, int]) -> Iterator[None]:
    """Record the largest output of ``head``, and the elements of vocabulary-wide tensors (logits, their
    log-softmax) that autograd keeps for backward; inside a checkpointed region torch's own hooks take over, and
    what they would keep is recomputed instead."""

    def on_output(module: nn.Module, args: Any, output: Tensor) -> None:
        sizes["largest_output"] = max(sizes["largest_output"], output.numel())

    def on_save(tensor: Tensor) -> Tensor:
        if tensor.dim() > 0 and tensor.size(-1) == VOCAB and not isinstance(tensor, nn.Parameter):
            sizes["kept"] += tensor.numel()
        return tensor

    handle = head.register_forward_hook(on_output)
    try:
        with torch.autograd.graph.saved_tensors_hooks(on_save, lambda tensor: tensor):
            yield
    finally:
        handle.remove()


def test_the_full_logits_never_exist() -> None:
    model: Any = _model("shape:tiny-llama")
    batch = _batch()
    head = model.get_output_embeddings()
    full_logits = batch["input_ids"].numel() * VOCAB
    chunk_tokens = 8

    sizes = {"largest_output": 0, "kept": 0}
    with _logits_seen(head, sizes):
        nll, tokens = causal_lm_nll(model, batch["input_ids"], batch["attention_mask"], batch["labels"], chunk_tokens)
        (nll / tokens).backward()  # backward recomputes each chunk's logits: the forward hook sees those too
    assert sizes == {"largest_output": chunk_tokens * VOCAB, "kept": 0}
    assert all(p.grad is not None for p in model.parameters())

    plain = {"largest_output": 0, "kept": 0}  # the check sees the model's own loss make and keep the logits
    with _logits_seen(head, plain):
        model(**batch).loss.backward()
    assert plain["largest_output"] == full_logits and plain["kept"] >= full_logits


def test_models_that_change_their_logits_are_not_chunked() -> None:
    config = AutoConfig.for_model("gemma2", vocab_size=VOCAB, intermediate_size=64, head_dim=8, **TINY)
    assert config.final_logit_softcapping is not None  # its logits are not just the output layer's
    assert not supports_chunked_loss(AutoModelForCausalLM.from_config(config))
    assert not supports_chunked_loss(nn.Linear(2, 2))
