"""Tokenised datasets and length-bucketed batches for text classification (padded by transformers' collator).

Dynamic padding pads each batch to its own longest sequence rather than to ``max_length``; with short texts
(most movie-review snippets and MRPC pairs are far below 128 tokens) this is most of the speed of a run.
Length bucketing goes further: batches are cut from runs of similar length, so there is little padding left.

Distributed runs: sharding is Lightning's (``use_distributed_sampler``). :class:`LengthBucketBatchSampler` is a batch
sampler of its own because bucketing regroups indices into batches, which no index sampler can; it wraps an index
sampler, and Lightning re-creates it around its ``DistributedSampler`` (a disjoint shard per rank, reshuffled per
epoch through ``set_epoch``), so the batch sampler only regroups this rank's indices.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, Sampler, SequentialSampler
from transformers import PreTrainedTokenizerBase

from lightning_zero.errors import ZeroConfigError, ZeroDataError

#: The token features a classification model takes, padded with these values.
PAD_VALUES = {"input_ids": None, "attention_mask": 0, "token_type_ids": 0}


@dataclass(frozen=True)
class TextExamples:
    """Raw examples of one split: texts, optional second texts (sentence pairs) and integer labels."""

    texts: list[str]
    labels: list[int]
    text_pairs: list[str] | None = None

    def __post_init__(self) -> None:
        if len(self.texts) != len(self.labels) or (
            self.text_pairs is not None and len(self.text_pairs) != len(self.texts)
        ):
            raise ZeroDataError("Texts, text pairs and labels differ in length: check the data's columns.")

    def __len__(self) -> int:
        return len(self.texts)

    def take(self, indices: Sequence[int]) -> TextExamples:
        """The examples at ``indices``, in that order."""
        pairs = [self.text_pairs[i] for i in indices] if self.text_pairs is not None else None
        return TextExamples([self.texts[i] for i in indices], [self.labels[i] for i in indices], pairs)


class TokenizedDataset(Dataset):
    """Token ids (unpadded, one list per example) and labels; items are dicts of lists for the collator."""

    def __init__(self, features: Mapping[str, Sequence[Sequence[int]]], labels: Sequence[int]) -> None:
        self.features = {key: list(values) for key, values in features.items() if key in PAD_VALUES}
        if "input_ids" not in self.features:
            raise ZeroConfigError("Tokenized features have no `input_ids`: use a Hugging Face tokenizer.")
        self.labels = list(labels)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, Any]:
        item: dict[str, Any] = {key: values[index] for key, values in self.features.items()}
        item["labels"] = self.labels[index]
        return item

    @property
    def lengths(self) -> list[int]:
        """The number of tokens of each example (what length bucketing sorts by)."""
        return [len(ids) for ids in self.features["input_ids"]]


def tokenize_examples(tokenizer: PreTrainedTokenizerBase, examples: TextExamples, max_length: int) -> TokenizedDataset:
    """Tokenise all ``examples`` in one batched call, truncated to ``max_length`` and not padded."""
    encoded = tokenizer(
        examples.texts,
        examples.text_pairs,
        truncation=True,
        max_length=max_length,
        padding=False,
    )
    return TokenizedDataset(dict(encoded), examples.labels)


class LengthBucketBatchSampler(BatchSampler):
    """Batches of similar length: indices from ``sampler`` are cut into chunks, sorted by length, and batched.

    Each chunk holds ``chunk_batches`` batches; the batch order is then shuffled (unless ``shuffle`` is off),
    so training still sees lengths in random order. Which indices are used, and their order before
    chunking, is the wrapped ``sampler``'s: wrap a ``DistributedSampler`` for a disjoint shard per rank.
    The shuffle is seeded by ``seed`` and the epoch (the wrapped sampler's ``epoch`` when it has one, as a
    ``DistributedSampler`` does, else the one given to :meth:`set_epoch`), so every epoch is reproducible.

    Args:
        sampler: Index sampler (e.g. ``DistributedSampler``, ``RandomSampler``, ``SequentialSampler``).
        batch_size: Examples per batch.
        drop_last: Drop the last, smaller batch.
        lengths: Length of every example of the dataset, by dataset index.
        chunk_batches: Batches per sorted chunk: larger means less padding and less randomness.
        shuffle: Shuffle the order of the batches.
        seed: Seed of the batch-order shuffle.
    """

    def __init__(
        self,
        sampler: Sampler[int] | Sequence[int],
        batch_size: int,
        drop_last: bool,
        lengths: Sequence[int],
        chunk_batches: int = 50,
        shuffle: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__(sampler, batch_size, drop_last)
        if chunk_batches < 1:
            raise ZeroConfigError(f"chunk_batches must be >= 1, got {chunk_batches}: use e.g. 50.")
        self.lengths = lengths
        self.chunk_batches = chunk_batches
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch here and on the wrapped sampler (Lightning calls the wrapped sampler's directly)."""
        self.epoch = epoch
        set_epoch = getattr(self.sampler, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)

    def _current_epoch(self) -> int:
        return int(getattr(self.sampler, "epoch", self.epoch))

    def _sorted_batches(self, indices: list[int]) -> list[list[int]]:
        chunk = self.batch_size * self.chunk_batches
        batches: list[list[int]] = []
        for start in range(0, len(indices), chunk):
            part = sorted(indices[start : start + chunk], key=lambda index: self.lengths[index])
            batches.extend(part[i : i + self.batch_size] for i in range(0, len(part), self.batch_size))
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:
            batches.pop()
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        batches = self._sorted_batches(list(self.sampler))
        if not self.shuffle:
            yield from batches
            return
        generator = torch.Generator().manual_seed(self.seed + self._current_epoch())
        for position in torch.randperm(len(batches), generator=generator).tolist():
            yield batches[position]


def build_dataloader(
    dataset: TokenizedDataset,
    collator: Callable[[list[dict[str, Any]]], dict[str, torch.Tensor]],
    batch_size: int,
    *,
    train: bool,
    num_workers: int = 0,
    bucket_by_length: bool = False,
    seed: int = 0,
) -> DataLoader:
    """A data loader over ``dataset``, padded per batch, shuffled for training, optionally length-bucketed.

    Distributed runs shard it through Lightning (``use_distributed_sampler``), which swaps in its
    ``DistributedSampler``, also inside the bucketing batch sampler.
    """
    common: dict[str, Any] = {
        "collate_fn": collator,
        "num_workers": num_workers,
        "persistent_workers": num_workers > 0,
    }
    if not bucket_by_length:
        return DataLoader(dataset, batch_size=batch_size, shuffle=train, drop_last=False, **common)
    sampler: Sampler[int] = RandomSampler(dataset) if train else SequentialSampler(dataset)
    batch_sampler = LengthBucketBatchSampler(
        sampler, batch_size, drop_last=False, lengths=dataset.lengths, shuffle=train, seed=seed
    )
    return DataLoader(dataset, batch_sampler=batch_sampler, **common)
