"""Text classification data: a base data module (tokenise in ``setup``, pad per batch) and local data files
(CSV, TSV, JSON, JSON Lines, Parquet).

:class:`TextClassificationDataModule` holds everything the concrete data modules share: the tokenizer, the
deterministic train/validation split, subsets for quick runs, and the rank-aware data loaders of
:mod:`lightning_zero.app.data.batching`. Subclasses only say where their examples come from (``load_examples``).
"""

from __future__ import annotations

import codecs
import csv
import io
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader
from transformers import DataCollatorWithPadding

from lightning_zero.app.data.batching import (
    TextExamples,
    TokenizedDataset,
    build_dataloader,
    tokenize_examples,
)
from lightning_zero.app.data.splits import seeded_split
from lightning_zero.app.models.loading import load_tokenizer
from lightning_zero.errors import ZeroConfigError, ZeroDataError
from lightning_zero.packages import PYARROW

DEFAULT_TOKENIZER = "sentence-transformers/all-MiniLM-L6-v2"
TRAIN, VALIDATION = "train", "validation"
DATA_FILE_SUFFIXES = (".csv", ".tsv", ".json", ".jsonl", ".parquet")


def split_examples(examples: TextExamples, val_fraction: float, seed: int) -> dict[str, TextExamples]:
    """A deterministic random train/validation split: the same ``seed`` gives the same split on every rank."""
    train, val = seeded_split(len(examples), val_fraction, seed)
    return {TRAIN: examples.take(train), VALIDATION: examples.take(val)}


def limit_examples(examples: TextExamples, limit: int | None) -> TextExamples:
    """The first ``limit`` examples (all when ``limit`` is None); splits are shuffled, so this is a random subset."""
    if limit is None:
        return examples
    if limit < 1:
        raise ZeroConfigError(f"A limit must be a positive number of examples, got {limit}: use null for all.")
    return examples.take(range(min(limit, len(examples))))


def encode_labels(
    values: Iterable[Any], label_names: Sequence[str] | None = None
) -> tuple[list[int], list[str] | None]:
    """Integer labels from a label column, and the names they stand for (None when the column held integers).

    With ``label_names`` a value's label is its position in that list. Without, integer-like values (``1``,
    ``"1"``, ``True``) are used as they are, and any other values are numbered in sorted order.
    """
    raw = list(values)
    if label_names is not None:
        names = [str(name) for name in label_names]
        index = {name: position for position, name in enumerate(names)}
        unknown = sorted({str(value) for value in raw} - index.keys())
        if unknown:
            raise ZeroDataError(f"Labels {unknown[:5]} are not in label_names {names}: add them to label_names.")
        return [index[str(value)] for value in raw], names
    integers = _as_integers(raw)
    if integers is not None:
        return integers, None
    names = sorted({str(value) for value in raw})
    index = {name: position for position, name in enumerate(names)}
    return [index[str(value)] for value in raw], names


def _as_integers(values: list[Any]) -> list[int] | None:
    try:
        integers = [int(value) for value in values]
    except (TypeError, ValueError):
        return None
    if any(
        str(integer) != str(value).strip() and not isinstance(value, bool)
        for integer, value in zip(integers, values, strict=True)
    ):
        return None
    return integers


def read_records(path: str | Path, encoding: str = "utf-8") -> list[dict[str, Any]]:
    """Rows of a ``.csv``, ``.tsv``, ``.json`` (a list of objects, an object of columns, or JSON lines),
    ``.jsonl`` or ``.parquet`` file; text files are read in ``encoding`` (a UTF-8 byte-order mark is skipped)."""
    path = Path(path).expanduser()
    check_data_file(path)
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return _parquet_records(path)
    # The standard library's readers, not `datasets`' CSV/JSON loaders: those parse through pandas, which reads
    # texts such as "NA" or "null" as missing values, and they write an Arrow cache of every file they read.
    text = decode_file(path, encoding)
    if suffix in (".csv", ".tsv"):
        return _delimited_records(path, text, "\t" if suffix == ".tsv" else ",")
    if suffix == ".json":
        return _json_records(path, text)
    return _json_lines(path, text)


def check_data_file(path: Path) -> None:
    """A one-line error unless ``path`` is a data file of a kind :func:`read_records` reads."""
    if path.is_dir():
        raise ZeroDataError(
            f"Data file {str(path)!r} is a directory: name a file in it ({', '.join(DATA_FILE_SUFFIXES)})."
        )
    if not path.is_file():
        raise ZeroDataError(f"Data file {str(path)!r} does not exist: check the path.")
    if path.suffix.lower() not in DATA_FILE_SUFFIXES:
        raise ZeroDataError(f"Unsupported data file {path.name!r}: use {', '.join(DATA_FILE_SUFFIXES)}.")


def check_encoding(encoding: str) -> None:
    """A one-line error unless ``encoding`` is a text encoding Python knows."""
    try:
        codecs.lookup(encoding)
    except LookupError:
        raise ZeroConfigError(
            f"Unknown encoding {encoding!r}: use a Python codec name such as utf-8, latin-1 or cp1252."
        ) from None


def decode_file(path: Path, encoding: str) -> str:
    """The text of ``path`` in ``encoding``, or a one-line error naming the first byte that is not valid in it."""
    data = path.read_bytes()
    if b"\0" in data and not codecs.lookup(encoding).name.startswith(("utf-16", "utf-32")):
        raise ZeroDataError(
            f"Data file {str(path)!r} is binary, not text (a checkpoint or an archive?): name a {path.suffix} text"
            " file of rows."
        )
    skipped = 0
    if codecs.lookup(encoding).name == "utf-8" and data.startswith(codecs.BOM_UTF8):
        skipped = len(codecs.BOM_UTF8)  # Excel's "CSV UTF-8" starts with one
    try:
        return data[skipped:].decode(encoding)
    except UnicodeDecodeError as error:
        offset = skipped + error.start
        line = data.count(b"\n", 0, offset) + 1
        raise ZeroDataError(
            f"Data file {str(path)!r} is not valid {encoding} at byte {offset} (line {line}): "
            "pass data.init_args.encoding: latin-1 (or the file's own, e.g. cp1252)."
        ) from None


def _delimited_records(path: Path, text: str, delimiter: str) -> list[dict[str, Any]]:
    kind = "TSV" if delimiter == "\t" else "CSV"
    try:
        rows = list(csv.DictReader(io.StringIO(text, newline=""), delimiter=delimiter))
    except csv.Error as error:
        raise ZeroDataError(f"Data file {str(path)!r} is not valid {kind} ({error}): fix the file.") from None
    extra = next((index for index, row in enumerate(rows) if None in row), None)  # DictReader's key for extras
    if extra is not None:
        raise ZeroDataError(
            f"Row {extra + 1} of {str(path)!r} (header not counted) has more fields than the header: quote texts "
            f'that hold {"tabs" if kind == "TSV" else "commas"} ("like, this").'
        )
    return rows


def _json_lines(path: Path, text: str) -> list[dict[str, Any]]:
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ZeroDataError(
                f"Line {number} of {str(path)!r} is not valid JSON ({error.msg}, column {error.colno}): fix the line."
            ) from None
        if not isinstance(record, Mapping):
            raise ZeroDataError(f"Line {number} of {str(path)!r} is not a JSON object: write one object a line.")
        records.append(dict(record))
    return records


def _json_records(path: Path, text: str) -> list[dict[str, Any]]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        if error.msg == "Extra data":  # a first value, then more: JSON lines under a .json name
            return _json_lines(path, text)
        raise ZeroDataError(
            f"Data file {str(path)!r} is not valid JSON ({error.msg} at line {error.lineno}, column {error.colno}): "
            "fix the file."
        ) from None
    if isinstance(data, Mapping) and all(isinstance(column, list) for column in data.values()):
        columns = list(data)
        try:
            return [dict(zip(columns, row, strict=True)) for row in zip(*data.values(), strict=True)]
        except ValueError:
            raise ZeroDataError(f"The columns of {path.name!r} differ in length: fix the JSON.") from None
    if isinstance(data, list) and all(isinstance(row, Mapping) for row in data):
        return [dict(row) for row in data]
    raise ZeroDataError(f"{path.name!r} is not a list of objects nor an object of columns: reshape the JSON.")


def _parquet_records(path: Path) -> list[dict[str, Any]]:
    if not PYARROW:
        raise ZeroConfigError(
            f"Reading {path.name!r} needs the `pyarrow` package: run `pip install pyarrow` "
            "(`pip install lightning-zero[datasets]` brings it)."
        )
    import pyarrow
    import pyarrow.parquet

    try:
        return list(pyarrow.parquet.read_table(path).to_pylist())
    except pyarrow.ArrowException as error:
        raise ZeroDataError(f"Data file {str(path)!r} is not valid Parquet ({error}): check the file.") from None


def column(records: Sequence[Mapping[str, Any]], name: str, source: str) -> list[Any]:
    """The values of column ``name``, or a one-line error listing the columns ``source`` has, or naming the first
    row without a value (an empty JSON/Parquet value, or a CSV row with too few fields)."""
    if records and name not in records[0]:
        raise ZeroDataError(f"{source!r} has no column {name!r}: choose one of {sorted(records[0])}.")
    values = [record.get(name) for record in records]
    missing = next((index for index, value in enumerate(values) if value is None), None)
    if missing is not None:
        raise ZeroDataError(
            f"Row {missing + 1} of {source!r} (header not counted) has no {name!r} value: fill it in or drop the row."
        )
    return values


class TextClassificationDataModule(LightningDataModule):
    """Base of the text-classification data modules: tokenise in ``setup``, pad per batch, shard per rank.

    Subclasses implement :meth:`load_examples`. Under DDP/ZeRO each rank tokenises the (small) data itself and
    Lightning's ``DistributedSampler`` gives it its own shard.

    Args:
        tokenizer: Tokenizer name or folder (a shipped model such as ``all-MiniLM-L6-v2`` loads offline).
        max_length: Truncate texts (pairs together) to this many tokens.
        batch_size: Training examples per batch and per process.
        eval_batch_size: Validation batch size (defaults to ``batch_size``).
        num_workers: Data loader worker processes.
        bucket_by_length: Batch examples of similar length together (less padding; see
            :class:`~lightning_zero.app.data.batching.LengthBucketBatchSampler`).
        seed: Seed of the train/validation split and of the length-bucketed batch order (plain shuffling follows
            ``seed_everything``, as Lightning seeds its distributed sampler with it).
        limit_train: Use only this many training examples (the first of the split; for quick runs).
        limit_val: Use only this many validation examples.
    """

    def __init__(
        self,
        tokenizer: str = DEFAULT_TOKENIZER,
        max_length: int = 128,
        batch_size: int = 32,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        bucket_by_length: bool = False,
        seed: int = 42,
        limit_train: int | None = None,
        limit_val: int | None = None,
    ) -> None:
        super().__init__()
        if max_length < 2 or batch_size < 1:
            raise ZeroConfigError(f"max_length ({max_length}) must be >= 2 and batch_size ({batch_size}) >= 1.")
        self.tokenizer_name = tokenizer
        self.max_length = max_length
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.num_workers = num_workers
        self.bucket_by_length = bucket_by_length
        self.seed = seed
        self.limits = {TRAIN: limit_train, VALIDATION: limit_val}
        self.datasets: dict[str, TokenizedDataset] = {}
        self.label_names: list[str] | None = None
        self.collator: DataCollatorWithPadding | None = None
        self.examples_read: dict[str, TextExamples] | None = None  # read before launch, for `setup` to take

    def load_examples(self) -> dict[str, TextExamples]:
        """The raw ``"train"`` and ``"validation"`` examples (labels already integers)."""
        raise NotImplementedError

    @property
    def num_labels(self) -> int | None:
        """The number of classes in the data (after :meth:`setup`; None before)."""
        if self.label_names is not None:
            return len(self.label_names)
        if not self.datasets:
            return None
        return 1 + max(max(dataset.labels, default=0) for dataset in self.datasets.values())

    def setup(self, stage: str | None = None) -> None:
        """Load and tokenise the examples once (later calls do nothing)."""
        if self.datasets:
            return
        tokenizer = load_tokenizer(self.tokenizer_name)
        if tokenizer.pad_token_id is None:
            raise ZeroConfigError(f"Tokenizer {self.tokenizer_name!r} has no pad token: use one that has.")
        self.collator = DataCollatorWithPadding(tokenizer, return_tensors="pt")  # right-pads to the batch's longest
        read, self.examples_read = self.examples_read or self.load_examples(), None
        for split, examples in read.items():
            limited = limit_examples(examples, self.limits[split])
            self.datasets[split] = tokenize_examples(tokenizer, limited, self.max_length)

    def _dataloader(self, split: str, batch_size: int, train: bool) -> DataLoader:
        if split not in self.datasets or self.collator is None:
            raise ZeroConfigError(f"No {split!r} data: call `setup()` first (the Trainer does).")
        return build_dataloader(
            self.datasets[split],
            self.collator,
            batch_size,
            train=train,
            num_workers=self.num_workers,
            bucket_by_length=self.bucket_by_length,
            seed=self.seed,
        )

    def train_dataloader(self) -> DataLoader:
        """The shuffled training data, padded per batch (one shard per rank under DDP/ZeRO)."""
        return self._dataloader(TRAIN, self.batch_size, train=True)

    def val_dataloader(self) -> DataLoader:
        """The validation data, in order, padded per batch (one shard per rank under DDP/ZeRO)."""
        return self._dataloader(VALIDATION, self.eval_batch_size, train=False)


class TextClassificationFilesDataModule(TextClassificationDataModule):
    """Text classification from local files, single texts or sentence pairs: ``.csv``, ``.tsv``, ``.json`` (a list
    of objects, an object of columns, or JSON lines), ``.jsonl`` and ``.parquet`` (needs ``pyarrow``, which
    ``datasets`` brings). String labels are numbered (see ``label_names``) and their names kept: they become the
    model's ``id2label`` and a Hugging Face export predicts them.

    Args:
        train_file: Training data.
        validation_file: Validation data; without it, ``val_fraction`` of ``train_file`` is held out.
        text_column: Column with the text (the first sentence of a pair).
        text_pair_column: Column with the second sentence of a pair, if any.
        label_column: Column with the label: integers, or names (see ``label_names``).
        label_names: Label names in class order; by default integer labels are used as they are and names
            are numbered in sorted order.
        val_fraction: Share of ``train_file`` held out when there is no ``validation_file``.
        encoding: Text encoding of the CSV/TSV/JSON files (``latin-1``, ``cp1252``, ...); a UTF-8 byte-order
            mark is skipped.
        **kwargs: See :class:`~lightning_zero.app.data.text_files.TextClassificationDataModule`.
    """

    # LightningCLI reads this signature; keeping each argument is the same few lines as in the other data modules.
    def __init__(
        self,
        train_file: str,
        validation_file: str | None = None,
        text_column: str = "text",
        text_pair_column: str | None = None,
        label_column: str = "label",
        label_names: list[str] | None = None,
        val_fraction: float = 0.1,
        encoding: str = "utf-8",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        check_encoding(encoding)
        self.save_hyperparameters()
        self.encoding = encoding
        self.train_file = train_file
        self.validation_file = validation_file
        self.text_column = text_column
        self.text_pair_column = text_pair_column
        self.label_column = label_column
        self.given_label_names = label_names
        self.val_fraction = val_fraction

    def check_files(self) -> None:
        """Read the files now: the CLI calls this in the launching process, so that bad data ends the run with one
        error line before any rank starts; ``setup`` then tokenises what was read here, without reading again."""
        self.examples_read = self.load_examples()

    def _read(self, path: str) -> tuple[list[str], list[str] | None, list[Any]]:
        records = read_records(path, self.encoding)
        if not records:
            raise ZeroDataError(f"Data file {path!r} has no rows: check the file.")
        texts = [str(text) for text in column(records, self.text_column, path)]
        pairs = None
        if self.text_pair_column is not None:
            pairs = [str(text) for text in column(records, self.text_pair_column, path)]
        return texts, pairs, column(records, self.label_column, path)

    def load_examples(self) -> dict[str, TextExamples]:
        """Read the files; labels of both splits are encoded together so names map to the same integers."""
        train_texts, train_pairs, train_labels = self._read(self.train_file)
        if self.validation_file is None:
            labels, self.label_names = encode_labels(train_labels, self.given_label_names)
            splits = split_examples(TextExamples(train_texts, labels, train_pairs), self.val_fraction, self.seed)
        else:
            val_texts, val_pairs, val_labels = self._read(self.validation_file)
            labels, self.label_names = encode_labels(train_labels + val_labels, self.given_label_names)
            n_train = len(train_texts)
            splits = {
                TRAIN: TextExamples(train_texts, labels[:n_train], train_pairs),
                VALIDATION: TextExamples(val_texts, labels[n_train:], val_pairs),
            }
        return splits
