"""Dialog data for a seq2seq chatbot: (history -> next turn) pairs from shipped or ``datasets`` corpora.

* :class:`ChitChatDataModule` -- the ``chitchat-dataset`` package's ``dataset.json`` (7,168 conversations,
  turns alternate speakers; 131,569 pairs with a history window of 1).
* :class:`ChatterbotDataModule` -- the ``chatterbot-corpus`` package's YAML dialogs.
* :class:`HFDialogDataModule` -- anything ``datasets.load_dataset`` reads (hub or local JSON files).

A source is the last ``history_window`` turns, each after a speaker token (``<speaker1>`` for the other
party, ``<speaker2>`` for the bot's own earlier turns), after an optional prefix such as the report's
``"chatbot: "``. The target is the next turn. Conversations, not pairs, are split into train/validation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset
from transformers import PreTrainedTokenizerBase

from lightning_zero.app.data.base import TokenizerDataModule
from lightning_zero.app.data.corpora import Conversation, load_chatterbot, load_chitchat
from lightning_zero.app.data.splits import seeded_split
from lightning_zero.app.data.tokenizers import SPEAKER_TOKENS
from lightning_zero.errors import ZeroConfigError, ZeroDataError
from lightning_zero.packages import load_hf_dataset

IGNORE_INDEX = -100


@dataclass(frozen=True)
class DialogPair:
    """One training example: the formatted history, the reply, and the conversation it came from."""

    source: str
    target: str
    conversation: int


def format_source(
    history: Sequence[str], speaker_tokens: Sequence[str] | None = SPEAKER_TOKENS, prefix: str = ""
) -> str:
    """The model input for ``history`` (oldest first, the last turn is the other party's).

    Turns are marked from the reply's point of view: ``speaker_tokens[0]`` for the other party,
    ``speaker_tokens[1]`` for the bot's own earlier turns. ``None`` leaves them out (turns are then joined
    by a space).
    """
    if not speaker_tokens:
        return prefix + " ".join(history)
    other, own = speaker_tokens
    last = len(history) - 1
    return prefix + "".join((other if (last - i) % 2 == 0 else own) + turn for i, turn in enumerate(history))


def dialog_pairs(
    conversations: Sequence[Conversation],
    history_window: int = 1,
    speaker_tokens: Sequence[str] | None = SPEAKER_TOKENS,
    source_prefix: str = "",
    conversation_ids: Sequence[int] | None = None,
) -> list[DialogPair]:
    """Every (last ``history_window`` turns -> next turn) pair of every conversation, in order.

    Pairs with a blank reply or a blank last turn are skipped (blank turns stay in the history so that
    speakers keep alternating).
    """
    if history_window < 1:
        raise ZeroConfigError(f"history_window must be at least 1, got {history_window}: set it to 1 or more.")
    ids = range(len(conversations)) if conversation_ids is None else conversation_ids
    pairs = []
    for conv_id in ids:
        turns = conversations[conv_id]
        for i in range(1, len(turns)):
            if not turns[i].strip() or not turns[i - 1].strip():
                continue
            history = turns[max(0, i - history_window) : i]
            pairs.append(DialogPair(format_source(history, speaker_tokens, source_prefix), turns[i], conv_id))
    return pairs


class PairDataset(Dataset):
    """A list of :class:`DialogPair` as a map-style dataset."""

    def __init__(self, pairs: Sequence[DialogPair]) -> None:
        self.pairs = list(pairs)

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> DialogPair:
        return self.pairs[index]


class DialogCollator:
    """Tokenises a batch of pairs with dynamic padding; labels are padded with -100.

    Sources are truncated from the left (the most recent turns are kept), targets from the right.
    The batch carries the raw replies as ``"references"`` for BLEU.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, max_source_length: int, max_target_length: int) -> None:
        self.tokenizer = tokenizer
        self.max_source_length = max_source_length
        self.max_target_length = max_target_length

    def __call__(self, pairs: Sequence[DialogPair]) -> dict[str, Any]:
        sources = self._encode([p.source for p in pairs], self.max_source_length, "left")
        targets = self._encode([p.target for p in pairs], self.max_target_length, "right")
        labels = targets["input_ids"].masked_fill(targets["attention_mask"] == 0, IGNORE_INDEX)
        return {
            "input_ids": sources["input_ids"],
            "attention_mask": sources["attention_mask"],
            "labels": labels,
            "references": [p.target for p in pairs],
        }

    def _encode(self, texts: list[str], max_length: int, side: str) -> dict[str, torch.Tensor]:
        previous = self.tokenizer.truncation_side
        self.tokenizer.truncation_side = side
        try:
            return self.tokenizer(texts, max_length=max_length, truncation=True, padding=True, return_tensors="pt")
        finally:
            self.tokenizer.truncation_side = previous


class DialogDataModule(TokenizerDataModule):
    """Shared machinery of the dialog data modules; subclasses say where conversations come from.

    Args:
        tokenizer: See :class:`~lightning_zero.app.data.base.TokenizerDataModule`.
        tokenizer_cache_dir: See :class:`~lightning_zero.app.data.base.TokenizerDataModule`.
        history_window: How many previous turns make up the source.
        source_prefix: Text before the source, e.g. the report's ``"chatbot: "``.
        speaker_tokens: Markers for the other party's and the bot's turns; ``None`` for plain text.
        max_source_length: Source tokens kept (the most recent).
        max_target_length: Target tokens kept.
        batch_size: Pairs per device and step.
        val_fraction: Share of conversations held out for validation.
        seed: Seed of the train/validation split.
        limit_train: Use only this many training pairs (quick runs).
        limit_val: Use only this many validation pairs.
        num_workers: DataLoader worker processes.
    """

    # LightningCLI reads this signature (with its own defaults): the parameters shared with the other data modules stay.
    def __init__(
        self,
        tokenizer: str = "bpe:chitchat",
        tokenizer_cache_dir: str | None = None,
        history_window: int = 1,
        source_prefix: str = "",
        speaker_tokens: tuple[str, str] | None = SPEAKER_TOKENS,
        max_source_length: int = 128,
        max_target_length: int = 64,
        batch_size: int = 32,
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
        self.history_window = history_window
        self.source_prefix = source_prefix
        self.speaker_tokens = tuple(speaker_tokens) if speaker_tokens else None
        self.max_source_length = max_source_length
        self.max_target_length = max_target_length
        self.train_pairs: list[DialogPair] = []
        self.val_pairs: list[DialogPair] = []

    def conversations(self) -> tuple[list[Conversation], list[Conversation] | None]:
        """Training conversations, and validation ones if the source has its own split (else ``None``)."""
        raise NotImplementedError

    def setup(self, stage: str | None = None) -> None:
        """Build the (history -> reply) pairs of both splits."""
        if self.train_pairs:
            return
        train_convs, val_convs = self.conversations()
        if val_convs is None:
            train_ids, val_ids = (sorted(ids) for ids in seeded_split(len(train_convs), self.val_fraction, self.seed))
            train, val = self._pairs(train_convs, train_ids), self._pairs(train_convs, val_ids)
        else:
            train, val = self._pairs(train_convs), self._pairs(val_convs)
        self.train_pairs = train[: self.limit_train]
        self.val_pairs = val[: self.limit_val]
        if not self.train_pairs or not self.val_pairs:
            raise ZeroDataError("No dialog pairs in a split: check the data and `limit_train`/`limit_val`.")

    def _pairs(self, conversations: list[Conversation], ids: list[int] | None = None) -> list[DialogPair]:
        return dialog_pairs(conversations, self.history_window, self.speaker_tokens, self.source_prefix, ids)

    def collator(self) -> DialogCollator:
        """The batch collator (tokenisation happens here, per batch)."""
        return DialogCollator(self.tokenizer, self.max_source_length, self.max_target_length)

    def train_dataloader(self) -> DataLoader:
        return self._loader(PairDataset(self.train_pairs), shuffle=True, collate_fn=self.collator())

    def val_dataloader(self) -> DataLoader:
        return self._loader(PairDataset(self.val_pairs), shuffle=False, collate_fn=self.collator())


class ChitChatDataModule(DialogDataModule):
    """The chitchat dataset (``pip install --no-deps chitchat-dataset==0.9.0``) as (history -> reply) pairs.

    Args:
        path: A ``dataset.json`` in the chitchat format; the installed package's file if unset.
        **kwargs: See :class:`DialogDataModule`.
    """

    def __init__(self, path: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.path = path

    def conversations(self) -> tuple[list[Conversation], None]:
        return load_chitchat(self.path), None


class ChatterbotDataModule(DialogDataModule):
    """The chatterbot-corpus YAML dialogs (``pip install --no-deps chatterbot-corpus==1.3.3``).

    Args:
        language: A folder of ``chatterbot_corpus/data``, e.g. ``english``.
        val_fraction: Share of conversations held out for validation (a larger default: the corpus is small).
        **kwargs: See :class:`DialogDataModule`.
    """

    def __init__(self, language: str = "english", val_fraction: float = 0.1, **kwargs: Any) -> None:
        super().__init__(val_fraction=val_fraction, **kwargs)
        self.language = language

    def conversations(self) -> tuple[list[Conversation], None]:
        return load_chatterbot(self.language), None


class HFDialogDataModule(DialogDataModule):
    """Dialogs through ``datasets.load_dataset`` (``pip install datasets``): hub data sets or local files.

    Each row is a conversation: a list of turns in ``turns_column``. A ``validation`` split is used when the
    data set has one; otherwise conversations are split by ``val_fraction``.

    Args:
        path: ``load_dataset``'s first argument, e.g. ``"json"`` with ``data_files``, or a hub name.
        name: The data set's configuration name, if any.
        data_files: Local files, e.g. ``{"train": "train.jsonl", "validation": "val.jsonl"}``.
        turns_column: The column holding each conversation's turns.
        **kwargs: See :class:`DialogDataModule`.
    """

    def __init__(
        self,
        path: str = "json",
        name: str | None = None,
        data_files: dict[str, str] | str | None = None,
        turns_column: str = "turns",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.path = path
        self.name = name
        self.data_files = data_files
        self.turns_column = turns_column

    def conversations(self) -> tuple[list[Conversation], list[Conversation] | None]:
        splits = load_hf_dataset(self.path, self.name, data_files=self.data_files)
        if "train" not in splits:
            raise ZeroDataError(f"Data set {self.path!r} has no `train` split: name one in `data_files`.")
        val_name = next((s for s in ("validation", "valid", "val") if s in splits), None)
        train = self._column(splits["train"])
        return train, self._column(splits[val_name]) if val_name else None

    def _column(self, split: Any) -> list[Conversation]:
        if self.turns_column not in split.column_names:
            raise ZeroDataError(
                f"No column {self.turns_column!r} in {split.column_names}: set `turns_column` to the list of turns."
            )
        return [[str(turn) for turn in turns] for turns in split[self.turns_column]]
