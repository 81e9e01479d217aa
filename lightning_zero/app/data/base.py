"""What the language data modules share: the tokenizer named by one string, its one-time training, batching."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset
from transformers import PreTrainedTokenizerBase

from lightning_zero.app.data.tokenizers import get_tokenizer


class TokenizerDataModule(LightningDataModule):
    """Base of the dialog and text-block data modules; subclasses build their datasets in ``setup``.

    Distributed sampling is Lightning's (``use_distributed_sampler``): the loaders here shuffle or not, and
    under DDP/ZeRO Lightning gives each rank its shard (seeded by ``seed_everything``).

    Args:
        tokenizer: ``bpe:CORPUS[:VOCAB]``, a local folder, a shipped model name or a hub name
            (see :mod:`lightning_zero.app.data.tokenizers`). Give the model the same string.
        tokenizer_cache_dir: Where a trained BPE is kept; ``~/.cache/lightning-zero/tokenizers`` if unset.
        batch_size: Examples per device and step.
        val_fraction: Share of the data held out for validation when the source has no validation split.
        seed: Seed of that split.
        limit_train: Use only this many training examples (quick runs).
        limit_val: Use only this many validation examples.
        num_workers: DataLoader worker processes.
    """

    # LightningCLI reads this signature; keeping each argument is the same few lines as in the other data modules.
    def __init__(
        self,
        tokenizer: str,
        tokenizer_cache_dir: str | None,
        batch_size: int,
        val_fraction: float,
        seed: int,
        limit_train: int | None,
        limit_val: int | None,
        num_workers: int,
    ) -> None:
        super().__init__()
        self.tokenizer_name = tokenizer
        self.tokenizer_cache_dir = tokenizer_cache_dir
        self.batch_size = batch_size
        self.val_fraction = val_fraction
        self.seed = seed
        self.limit_train = limit_train
        self.limit_val = limit_val
        self.num_workers = num_workers
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

    def _loader(self, dataset: Dataset, shuffle: bool, collate_fn: Callable[[list[Any]], Any]) -> DataLoader:
        return DataLoader(
            dataset, batch_size=self.batch_size, shuffle=shuffle, collate_fn=collate_fn, num_workers=self.num_workers
        )
