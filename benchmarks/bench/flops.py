"""Model FLOPs of a training step, for MFU: the usual 6·N per token plus attention, no recomputation counted.

Per token, forward plus backward costs ``6 · N`` FLOPs for the ``N`` weights it passes through (embeddings
excluded, a language-model head included) and ``12 · layers · d_attention · keys`` for the attention scores
and their weighted sum (PaLM's appendix B). Encoder-decoders count encoder weights on source tokens and
decoder weights on target tokens, with cross-attention keys being the source. Padded positions are counted:
the GPU computes them. Activation checkpointing's recomputed forward is *not* counted, so checkpointed rows
show the MFU of the useful work. DeBERTa's relative-position attention terms are left out (an undercount).
The counts come from the model built on the meta device: no memory, no weights.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import nn


@dataclasses.dataclass(frozen=True)
class StepFlops:
    """The FLOP model of one architecture: weights per stack and attention widths."""

    encoder_weights: int
    decoder_weights: int
    encoder_layers: int
    decoder_layers: int
    attention_width: int
    head_weights: int

    def per_sample(self, source: int, target: int = 0) -> float:
        """Forward + backward FLOPs of one example padded to ``source`` (and ``target``) tokens."""
        width = self.attention_width
        encoder = source * (6 * self.encoder_weights + 12 * self.encoder_layers * width * source)
        if not target:
            return float(encoder + source * 6 * self.head_weights)
        decoder = target * (6 * (self.decoder_weights + self.head_weights))
        decoder += target * 12 * self.decoder_layers * width * (target + source)
        return float(encoder + decoder)


def _matmul_weights(module: nn.Module) -> int:
    return sum(p.numel() for m in module.modules() if not isinstance(m, nn.Embedding) for p in m.parameters(False))


def step_flops(model: Any) -> StepFlops:
    """The FLOP model of a Hugging Face model (encoder-only, decoder-only or encoder-decoder)."""
    config = model.config
    heads = getattr(config, "num_heads", None) or getattr(config, "num_attention_heads", None) or config.n_head
    d_kv = getattr(config, "d_kv", None) or (getattr(config, "d_model", None) or config.hidden_size) // heads
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    head_weights = head.weight.numel() if isinstance(head, nn.Linear) else 0
    if config.is_encoder_decoder:
        encoder, decoder = model.get_encoder(), model.get_decoder()
        return StepFlops(
            encoder_weights=_matmul_weights(encoder),
            decoder_weights=_matmul_weights(decoder),
            encoder_layers=config.encoder_layers if hasattr(config, "encoder_layers") else config.num_layers,
            decoder_layers=config.decoder_layers if hasattr(config, "decoder_layers") else config.num_decoder_layers,
            attention_width=heads * d_kv,
            head_weights=head_weights,
        )
    head_ids = {id(p) for p in head.parameters()} if isinstance(head, nn.Module) else set()
    body = sum(
        p.numel()
        for m in model.modules()
        if not isinstance(m, nn.Embedding)
        for p in m.parameters(False)
        if id(p) not in head_ids
    )
    layers = getattr(config, "num_hidden_layers", None) or config.n_layer
    return StepFlops(body, 0, layers, 0, heads * d_kv, head_weights)
