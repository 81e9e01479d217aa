"""``lightning-zero chat --checkpoint PATH``: talk to a trained :class:`~lightning_zero.app.tasks.seq2seq.Seq2SeqTask`.

Reads one line per turn from stdin and prints the generated reply. The checkpoint is a Lightning ``.ckpt``
file or a DeepSpeed sharded checkpoint directory (consolidated to fp32 first). How sources were formatted in
training (history window, prefix, speaker tokens, source length) is read from the data module's
hyper-parameters stored in the checkpoint; the options below override it.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import os
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TextIO

import torch

from lightning_zero.app.data.dialog import format_source
from lightning_zero.app.data.tokenizers import SPEAKER_TOKENS
from lightning_zero.app.tasks.seq2seq import Seq2SeqTask
from lightning_zero.checkpoint.validate import check_checkpoint
from lightning_zero.errors import CommandParser, ZeroConfigError
from lightning_zero.internals import checkpoint_class_path

CHATBOT = f"{Seq2SeqTask.__module__}.{Seq2SeqTask.__qualname__}"


def build_parser() -> argparse.ArgumentParser:
    """The ``chat`` command's options."""
    parser = CommandParser(prog="lightning-zero chat", description="Chat with a trained seq2seq chatbot.")
    parser.add_argument("--checkpoint", required=True, help="a .ckpt file or a DeepSpeed checkpoint directory")
    parser.add_argument("--max-turns", type=int, default=None, help="stop after this many replies (default: at EOF)")
    parser.add_argument("--num-beams", type=int, default=None, help="beam width (default: the model's num_beams)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="reply length limit in tokens")
    parser.add_argument("--history-window", type=int, default=None, help="previous turns in each source")
    parser.add_argument("--tokenizer", default=None, help="override the tokenizer named in the checkpoint")
    parser.add_argument("--tokenizer-cache-dir", default=None, help="where a trained BPE tokenizer is cached")
    return parser


def consolidated_checkpoint(path: Path, scratch: Path) -> Path:
    """``path`` itself for a file; for a DeepSpeed sharded directory, a single fp32 ``.ckpt`` in ``scratch``."""
    if path.is_file():
        return path
    if not path.is_dir():
        raise ZeroConfigError(f"Checkpoint {str(path)!r} does not exist: pass a .ckpt file or a checkpoint directory.")
    from lightning.pytorch.utilities.deepspeed import convert_zero_checkpoint_to_fp32_state_dict

    output = scratch / "consolidated.ckpt"
    convert_zero_checkpoint_to_fp32_state_dict(str(path), str(output))
    return output


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send everything written to stdout (Python prints and the file descriptor) to stderr meanwhile.

    DeepSpeed's checkpoint conversion and logger print to stdout; stdout carries only replies.
    """
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def load_chatbot(
    path: Path, tokenizer: str | None = None, tokenizer_cache_dir: str | None = None
) -> tuple[Seq2SeqTask, dict]:
    """The task with its weights (on CPU, in eval mode) and the data module's stored hyper-parameters."""
    check_checkpoint(path)
    with tempfile.TemporaryDirectory() as scratch:
        file = consolidated_checkpoint(path, Path(scratch))
        checkpoint = torch.load(file, map_location="cpu", weights_only=False)
        check_chatbot(path, checkpoint.get("hyper_parameters") or {})
        overrides: dict[str, Any] = {}
        if tokenizer is not None:
            overrides["tokenizer"] = tokenizer
        if tokenizer_cache_dir is not None:
            overrides["tokenizer_cache_dir"] = tokenizer_cache_dir
        task = Seq2SeqTask.load_from_checkpoint(file, map_location="cpu", **overrides)
    task.eval()
    return task, dict(checkpoint.get("datamodule_hyper_parameters") or {})


def check_chatbot(path: Path, hyper_parameters: Mapping[str, Any]) -> None:
    """Raise unless the checkpoint's hyper-parameters are a :class:`Seq2SeqTask`'s (LightningCLI also stores its
    ``_class_path``)."""
    class_path = str(checkpoint_class_path(hyper_parameters, CHATBOT))
    accepted = inspect.signature(Seq2SeqTask).parameters
    foreign = sorted(name for name in hyper_parameters if not name.startswith("_") and name not in accepted)
    if class_path != CHATBOT or foreign:
        kind = class_path.rsplit(".", 1)[-1] if class_path != CHATBOT else f"model with {', '.join(foreign[:3])}"
        raise ZeroConfigError(
            f"Checkpoint '{path}' is not a chatbot's (it holds a {kind}): pass a checkpoint of a"
            f" {Seq2SeqTask.__name__} run, e.g. of `lightning-zero fit --config configs/blenderbot_cpu.yaml`."
        )


class ChatSession:
    """Keeps the conversation and turns each user line into a reply."""

    def __init__(self, task: Seq2SeqTask, data_hparams: dict, args: argparse.Namespace) -> None:
        self.task = task
        window = args.history_window or data_hparams.get("history_window", 1)
        self.history_window = max(1, int(window))
        speakers = data_hparams.get("speaker_tokens", SPEAKER_TOKENS)
        self.speaker_tokens = tuple(speakers) if speakers else None
        self.source_prefix = str(data_hparams.get("source_prefix", ""))
        self.max_source_length = int(data_hparams.get("max_source_length", 128))
        self.num_beams = args.num_beams
        self.max_new_tokens = args.max_new_tokens
        self.history: list[str] = []

    def reply(self, line: str) -> str:
        """The bot's answer to ``line``, given the last turns of the conversation."""
        self.history.append(line)
        source = format_source(self.history[-self.history_window :], self.speaker_tokens, self.source_prefix)
        tokenizer = self.task.tokenizer
        tokenizer.truncation_side = "left"
        encoded = tokenizer([source], max_length=self.max_source_length, truncation=True, return_tensors="pt")
        replies = self.task.generate_replies(
            encoded["input_ids"], encoded["attention_mask"], self.num_beams, self.max_new_tokens
        )
        self.history.append(replies[0])
        return replies[0]


def run_repl(session: ChatSession, lines: Iterable[str], out: TextIO, max_turns: int | None) -> int:
    """Answer each non-empty line; returns the number of replies."""
    turns = 0
    for raw in lines:
        line = raw.strip()
        if not line:
            continue
        print(session.reply(line), file=out, flush=True)
        turns += 1
        if max_turns is not None and turns >= max_turns:
            break
    return turns


def _check_counts(args: argparse.Namespace) -> None:
    for option in ("max_turns", "num_beams", "max_new_tokens", "history_window"):
        value = getattr(args, option)
        if value is not None and value < 1:
            flag = "--" + option.replace("_", "-")
            raise ZeroConfigError(f"chat: {flag} is {value}: give 1 or more, or leave it out for the default.")


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``lightning-zero chat``; returns the process exit status."""
    try:
        args = build_parser().parse_args(argv)
        _check_counts(args)
        with stdout_to_stderr():
            task, data_hparams = load_chatbot(
                Path(args.checkpoint).expanduser(), args.tokenizer, args.tokenizer_cache_dir
            )
    except ZeroConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if sys.stdin.isatty():
        print("Type a message and press Enter; Ctrl-D ends the chat.", file=sys.stderr)
    run_repl(ChatSession(task, data_hparams, args), sys.stdin, sys.stdout, args.max_turns)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
