"""Seq2seq chatbot: learning on chitchat, generation under ZeRO-3 in 2 processes, and the chat command.

The ZeRO-3 test runs this file as a 2-process worker (``python tests/test_seq2seq.py zero3 OUT``).
"""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest
import torch

from lightning_zero.app.data.dialog import ChitChatDataModule
from lightning_zero.app.tasks.seq2seq import Seq2SeqTask, needs_synced_generation, shift_right

if TYPE_CHECKING:
    import lightning as L

TOKENIZER = "bpe:chitchat:1024"
WORKER_TIMEOUT_S = 300
_SMALL: dict[str, Any] = {"max_source_length": 48, "max_target_length": 24}


def _trainer(**kwargs: Any) -> L.Trainer:
    import lightning as L

    defaults: dict[str, Any] = {
        "accelerator": "cpu",
        "devices": 1,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "num_sanity_val_steps": 0,
    }
    return L.Trainer(**{**defaults, **kwargs})


pytestmark = pytest.mark.usefixtures("one_thread")  # cache_dir and one_thread: tests/conftest.py


@pytest.fixture(scope="module")
def trained(cache_dir: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A tiny BlenderBot trained 30 steps on chitchat, its val loss before/after, and a saved .ckpt."""
    import lightning as L

    L.seed_everything(0)
    common: dict[str, Any] = {"tokenizer": TOKENIZER, "tokenizer_cache_dir": cache_dir}
    dm = ChitChatDataModule(batch_size=16, limit_train=2000, limit_val=32, history_window=2, **_SMALL, **common)
    task = Seq2SeqTask(model="shape:tiny-blenderbot", learning_rate=3e-3, num_beams=2, max_target_length=12, **common)
    trainer = _trainer(max_steps=30, val_check_interval=30)
    before = trainer.validate(task, dm, verbose=False)[0]
    trainer.fit(task, dm)
    after = {key: value.item() for key, value in trainer.callback_metrics.items()}
    checkpoint = tmp_path_factory.mktemp("ckpt") / "chatbot.ckpt"
    trainer.save_checkpoint(checkpoint)
    return {"task": task, "dm": dm, "before": before, "after": after, "checkpoint": checkpoint}


def test_chatbot_learns_on_chitchat(trained: dict[str, Any]) -> None:
    before, after = trained["before"], trained["after"]
    assert before["val_loss"] > 6.5  # random init over 1,024 tokens: ln(1024) = 6.93
    assert after["val_loss"] < before["val_loss"] - 0.7, (before, after)
    assert 0.0 <= after["val_bleu"] <= 1.0  # torchmetrics' BLEU is a fraction, not SacreBLEU's 0-100
    assert after["val_ppl"] == pytest.approx(math.exp(after["val_loss"]), rel=1e-4)


def test_replies_are_text_and_bleu_counts_them(trained: dict[str, Any]) -> None:
    task, dm = trained["task"], trained["dm"]
    batch = next(iter(dm.val_dataloader()))
    replies = task.generate_replies(batch["input_ids"][:3], batch["attention_mask"][:3], num_beams=2, max_new_tokens=8)
    assert len(replies) == 3 and all(isinstance(r, str) and r for r in replies)
    assert all(len(task.tokenizer(r, add_special_tokens=False)["input_ids"]) <= 8 for r in replies)
    task.val_bleu.reset()
    task.update_bleu(["the cat sat on the mat today"], ["the cat sat on the mat today"])
    assert task.val_bleu.compute().item() == pytest.approx(1.0)


def test_t5_shape_trains_and_generates(cache_dir: str) -> None:
    task = Seq2SeqTask(model="shape:tiny-t5", tokenizer=TOKENIZER, tokenizer_cache_dir=cache_dir, num_beams=2)
    task.configure_model()
    first = task.model
    task.configure_model()
    assert task.model is first  # built once
    dm = ChitChatDataModule(tokenizer=TOKENIZER, tokenizer_cache_dir=cache_dir, batch_size=4, limit_train=8, **_SMALL)
    dm.setup()
    batch = next(iter(dm.train_dataloader()))
    loss = task.training_step(batch, 0)
    loss.backward()
    assert 5.0 < loss.item() < 10.0  # random init over 1,024 tokens (ln 1024 = 6.93)
    assert len(task.generate_replies(batch["input_ids"], batch["attention_mask"], max_new_tokens=4)) == 4


def test_shift_right_matches_teacher_forcing() -> None:
    labels = torch.tensor([[5, 6, 7, -100], [8, -100, -100, -100]])
    assert shift_right(labels, start_id=1, pad_id=0).tolist() == [[1, 5, 6, 7], [1, 8, 0, 0]]


def test_single_process_needs_no_synced_generation() -> None:
    assert not needs_synced_generation(None)
    assert not needs_synced_generation(_trainer())


# --- the chat command ----------------------------------------------------------------------------------------


@pytest.mark.multiprocess
def test_chat_replies_to_piped_lines(trained: dict[str, Any]) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "lightning_zero.app.chat",
            "--checkpoint",
            str(trained["checkpoint"]),
            "--num-beams",
            "2",
        ],
        input="hello, how are you?\nwhat do you do for fun?\n",
        capture_output=True,
        text=True,
        timeout=120,
        start_new_session=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    replies = result.stdout.splitlines()
    assert len(replies) == 2 and all(reply.strip() for reply in replies), result.stdout


def test_chat_stops_after_max_turns_and_reports_a_missing_checkpoint(
    trained: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from lightning_zero.app import chat

    monkeypatch.setattr(sys, "stdin", io.StringIO("hi\n\nsecond\nthird\n"))
    assert chat.main(["--checkpoint", str(trained["checkpoint"]), "--max-turns", "1", "--num-beams", "1"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1
    assert chat.main(["--checkpoint", "/nonexistent/chatbot.ckpt"]) == 2
    assert "does not exist" in capsys.readouterr().err


# --- generation under ZeRO-3, 2 processes -------------------------------------------------------------


def _zero3_worker(out: str, cache_dir: str) -> None:
    import lightning as L

    import lightning_zero  # noqa: F401  (registers zero3)

    L.seed_everything(0)
    common: dict[str, Any] = {"tokenizer": TOKENIZER, "tokenizer_cache_dir": cache_dir}
    dm = ChitChatDataModule(batch_size=4, limit_train=32, limit_val=8, **_SMALL, **common)
    task = Seq2SeqTask(model="shape:tiny-blenderbot", learning_rate=3e-3, num_beams=3, max_target_length=10, **common)
    trainer = _trainer(devices=2, strategy="zero3", max_steps=2, limit_val_batches=2, val_check_interval=2)
    trainer.fit(task, dm)
    assert task.model is not None
    weight = cast(Any, task.model).get_input_embeddings().weight
    # Different batch sizes per rank: beams finish at different times, so ranks must stay in lock-step.
    rank = trainer.global_rank
    batch = next(iter(dm.val_dataloader()))
    replies = task.generate_replies(batch["input_ids"][: rank + 1], batch["attention_mask"][: rank + 1])
    trainer.save_checkpoint(Path(out).with_suffix(".ckpt"))
    result = {
        "replies": replies,
        "metrics": {key: value.item() for key, value in trainer.callback_metrics.items()},
        "partitioned": bool(hasattr(weight, "ds_id") and weight.ds_tensor.numel() < weight.ds_numel),
        "synced": needs_synced_generation(trainer),
    }
    Path(f"{out}.rank{rank}").write_text(json.dumps(result))


def run_worker(args: list[str], timeout: float = WORKER_TIMEOUT_S) -> str:
    """Run this file as a multi-process worker under a hard time-out that kills its whole process group."""
    from tests.helpers.launch import run_script  # the pytest process only: workers run this file as a script

    return run_script(Path(__file__), *args, timeout=timeout)


@pytest.mark.multiprocess
def test_generation_under_zero3_in_two_processes(
    tmp_path: Path, cache_dir: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "zero3"
    run_worker(["zero3", str(out), cache_dir])
    ranks = [json.loads(Path(f"{out}.rank{rank}").read_text()) for rank in (0, 1)]
    for rank, result in enumerate(ranks):
        assert result["partitioned"] and result["synced"]
        assert len(result["replies"]) == rank + 1 and all(isinstance(r, str) and r for r in result["replies"])
        assert "val_bleu" in result["metrics"] and "val_loss" in result["metrics"]
    val = [{k: v for k, v in r["metrics"].items() if k.startswith("val_")} for r in ranks]
    assert val[0] == val[1]  # reduced over ranks: the same numbers everywhere

    # The sharded checkpoint directory is consolidated by the chat command.
    from lightning_zero.app import chat

    assert (tmp_path / "zero3.ckpt").is_dir()
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello there\n"))
    assert chat.main(["--checkpoint", str(tmp_path / "zero3.ckpt"), "--num-beams", "2"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 1


if __name__ == "__main__":
    if sys.argv[1] == "zero3":
        _zero3_worker(sys.argv[2], sys.argv[3])
