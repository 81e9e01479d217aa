"""Transformer blocks are found without model code, and activation checkpointing keeps the maths."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
from torch import nn
from transformers import AutoModelForCausalLM, GPT2LMHeadModel
from transformers.models.gpt2.modeling_gpt2 import GPT2Block
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

from lightning_zero.app.models.shapes import shape_config
from lightning_zero.runtime.blocks import (
    compile_blocks,
    enable_activation_checkpointing,
    transformer_block_classes,
    transformer_blocks,
)
from tests.helpers.tiny import SEQ, VOCAB, tiny_gpt2_config


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(3))
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def test_hugging_face_blocks_come_from_no_split_modules() -> None:
    model = GPT2LMHeadModel(tiny_gpt2_config())
    assert transformer_block_classes(model) == {GPT2Block}
    assert len(transformer_blocks(model)) == 2


def test_plain_models_use_repeated_module_lists() -> None:
    assert transformer_block_classes(Stack()) == {nn.Sequential}
    assert len(transformer_blocks(Stack())) == 3


def gradients(
    model: nn.Module, inputs: torch.Tensor, loss_fn: Callable[[nn.Module, torch.Tensor], torch.Tensor]
) -> list[torch.Tensor]:
    model.zero_grad()
    loss_fn(model, inputs).backward()
    return [cast(torch.Tensor, p.grad).clone() for p in model.parameters()]


def test_checkpointing_a_plain_model_keeps_gradients_and_state_dict_keys() -> None:
    torch.manual_seed(0)
    model, inputs = Stack(), torch.randn(4, 8)
    keys = list(model.state_dict())
    expected = gradients(model, inputs, lambda m, x: m(x).sum())
    assert enable_activation_checkpointing(model) == 3
    assert list(model.state_dict()) == keys
    for a, b in zip(expected, gradients(model, inputs, lambda m, x: m(x).sum()), strict=True):
        torch.testing.assert_close(a, b)


def test_checkpointing_a_hugging_face_model_keeps_gradients() -> None:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(tiny_gpt2_config()).train()
    inputs = torch.randint(0, VOCAB, (2, SEQ))
    loss = lambda m, x: m(input_ids=x, labels=x).loss  # noqa: E731
    expected = gradients(model, inputs, loss)
    assert enable_activation_checkpointing(model) == 2
    assert model.transformer.gradient_checkpointing
    for a, b in zip(expected, gradients(model, inputs, loss), strict=True):
        torch.testing.assert_close(a, b)


def test_llama_blocks_are_found_compiled_and_checkpointed() -> None:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(shape_config("shape:tiny-llama", vocab_size=VOCAB)).train()
    assert transformer_block_classes(model) == {LlamaDecoderLayer}
    assert len(transformer_blocks(model)) == 2
    inputs = torch.randint(0, VOCAB, (2, SEQ))
    loss = lambda m, x: m(input_ids=x, labels=x).loss  # noqa: E731
    expected = gradients(model, inputs, loss)
    assert enable_activation_checkpointing(model) == 2
    assert compile_blocks(model) == 2
    assert all(block._compiled_call_impl is not None for block in transformer_blocks(model))
    # Inductor's fused float32 kernels round differently from eager (tests/test_fsdp2.py measured ~1e-6).
    for a, b in zip(expected, gradients(model, inputs, loss), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
