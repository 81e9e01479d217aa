"""Named shapes: the Llama 3 shapes are the published models' sizes, and their tiny twin has the same structure."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from lightning_zero.app.models.shapes import shape_config

# Parameter counts of the published models (Meta's model cards: 3.21B, 8.03B). Built on the meta device: no
# memory, a second each.
PUBLISHED = {"shape:llama-3.2-3b": 3.21e9, "shape:llama-3.1-8b": 8.03e9}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_llama_shapes_have_the_published_parameter_counts(name: str) -> None:
    config = shape_config(name)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    count = sum(p.numel() for p in model.parameters())  # tied embeddings are counted once
    assert count == pytest.approx(PUBLISHED[name], rel=0.01)
    assert config.vocab_size == 128256 and config.num_key_value_heads == 8
    assert config.rope_parameters["rope_theta"] == 500000.0
    assert model.config._attn_implementation == "sdpa"


def test_tiny_llama_is_the_same_structure() -> None:
    tiny, small = shape_config("shape:tiny-llama"), shape_config("shape:llama-3.2-3b")
    assert type(tiny) is type(small) and tiny.tie_word_embeddings and small.tie_word_embeddings
    assert not shape_config("shape:llama-3.1-8b").tie_word_embeddings
    assert tiny.num_attention_heads > tiny.num_key_value_heads  # grouped-query attention, as in the real ones
    assert tiny.rope_parameters["rope_type"] == small.rope_parameters["rope_type"] == "llama3"
    model = AutoModelForCausalLM.from_config(tiny)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert tiny.hidden_size * tiny.num_hidden_layers < small.hidden_size // 16
