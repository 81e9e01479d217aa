"""GLUE (and any Hugging Face ``datasets`` dataset) for sequence classification, e.g. ``glue``/``mrpc`` pairs.

``datasets`` is optional (``pip install lightning-zero[datasets]``) and imported only when data is loaded.
Hub datasets need internet; ``dataset="csv"`` or ``"json"`` with ``data_files`` reads local files offline
through the same code path.
"""

from __future__ import annotations

from typing import Any

from lightning_zero.app.data.batching import TextExamples
from lightning_zero.app.data.text_files import (
    TRAIN,
    VALIDATION,
    TextClassificationDataModule,
    encode_labels,
)
from lightning_zero.errors import ZeroDataError
from lightning_zero.packages import load_hf_dataset

#: Text columns (first, second) of each GLUE classification task.
GLUE_COLUMNS: dict[str, tuple[str, str | None]] = {
    "cola": ("sentence", None),
    "sst2": ("sentence", None),
    "mrpc": ("sentence1", "sentence2"),
    "qqp": ("question1", "question2"),
    "mnli": ("premise", "hypothesis"),
    "qnli": ("question", "sentence"),
    "rte": ("sentence1", "sentence2"),
    "wnli": ("sentence1", "sentence2"),
}


class GlueDataModule(TextClassificationDataModule):
    """A Hugging Face ``datasets`` dataset for classification: GLUE by default (MRPC sentence pairs).

    Args:
        dataset: ``datasets.load_dataset`` path: ``"glue"``, another hub dataset, or ``"csv"``/``"json"``.
        subset: The configuration name (the GLUE task, e.g. ``"mrpc"``); None for none.
        data_files: Local files per split for ``"csv"``/``"json"``, e.g. ``{"train": ..., "validation": ...}``.
        text_column: Column of the (first) text; by default the GLUE task's, else ``"text"``.
        text_pair_column: Column of the second text; by default the GLUE task's, else none.
        label_column: Column of the label (integers, or names numbered in sorted order).
        train_split: Name of the training split.
        validation_split: Name of the validation split (``"validation_matched"`` for MNLI).
        cache_dir: ``datasets`` cache folder (its default when None).
        **kwargs: See :class:`~lightning_zero.app.data.text_files.TextClassificationDataModule`.
    """

    # LightningCLI reads this signature; keeping each argument is the same few lines as in the other data modules.
    def __init__(
        self,
        dataset: str = "glue",
        subset: str | None = "mrpc",
        data_files: dict[str, str] | None = None,
        text_column: str | None = None,
        text_pair_column: str | None = None,
        label_column: str = "label",
        train_split: str = TRAIN,
        validation_split: str = VALIDATION,
        cache_dir: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.save_hyperparameters()
        self.dataset = dataset
        self.subset = subset
        self.data_files = data_files
        default_text, default_pair = GLUE_COLUMNS.get(subset or "", ("text", None))
        self.text_column = text_column or default_text
        self.text_pair_column = text_pair_column if text_pair_column is not None else default_pair
        self.label_column = label_column
        self.splits = {TRAIN: train_split, VALIDATION: validation_split}
        self.cache_dir = cache_dir

    def _load(self) -> Any:
        try:
            return load_hf_dataset(self.dataset, self.subset, data_files=self.data_files, cache_dir=self.cache_dir)
        except OSError as error:  # no network, no such dataset or file (ConnectionError, FileNotFoundError, ...)
            raise ZeroDataError(
                f"Could not load dataset {self.dataset!r}/{self.subset!r} ({error}): it needs the Hugging Face hub, "
                "or use dataset: csv/json with data_files for local files."
            ) from error

    def prepare_data(self) -> None:
        """Download (once, on one process) into the ``datasets`` cache."""
        self._load()

    def _columns(self, split: Any, name: str) -> list[Any]:
        if name not in split.column_names:
            raise ZeroDataError(f"Dataset {self.dataset!r} has no column {name!r}: choose one of {split.column_names}.")
        return list(split[name])

    def load_examples(self) -> dict[str, TextExamples]:
        """The train and validation splits (labels of both encoded together)."""
        loaded = self._load()
        parts = {}
        for key, split_name in self.splits.items():
            if split_name not in loaded:
                raise ZeroDataError(
                    f"Dataset {self.dataset!r} has no split {split_name!r}: choose one of {list(loaded)}."
                )
            parts[key] = loaded[split_name]
        raw_labels = {key: self._columns(part, self.label_column) for key, part in parts.items()}
        labels, self.label_names = encode_labels(raw_labels[TRAIN] + raw_labels[VALIDATION])
        feature = parts[TRAIN].features.get(self.label_column)
        if self.label_names is None and getattr(feature, "names", None):
            self.label_names = list(feature.names)  # a ClassLabel, as in GLUE
        n_train = len(raw_labels[TRAIN])
        label_parts = {TRAIN: labels[:n_train], VALIDATION: labels[n_train:]}
        examples = {}
        for key, part in parts.items():
            texts = [str(text) for text in self._columns(part, self.text_column)]
            pairs = None
            if self.text_pair_column is not None:
                pairs = [str(text) for text in self._columns(part, self.text_pair_column)]
            examples[key] = TextExamples(texts, label_parts[key], pairs)
        return examples
