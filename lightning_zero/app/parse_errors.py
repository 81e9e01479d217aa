"""One line out of jsonargparse's nested error messages: which key is wrong, the value given, and what it accepts.

jsonargparse reports a bad value as an indented tree (``Parser key "a":`` / ``Parser key "b":`` / reason, with
every Union alternative it tried); the user needs the dotted key, the value and the accepted values.
"""

from __future__ import annotations

import re
import traceback
from dataclasses import dataclass

from lightning.fabric.utilities.exceptions import MisconfigurationException

from lightning_zero.errors import LightningZeroError, ZeroConfigError
from lightning_zero.packages import INSTALL_APP, app_extra_error, missing_app_package

_KEY = re.compile(r'^Parser key "(?P<key>[^"]+)":?\s*(?P<rest>.*)$')
_CONTEXT = (
    "Does not validate",
    "Subtypes:",
    "Errors:",
    "Given value type:",
    "Problem with given class_path",
    "Problems parsing config",
    "Parser key",
)
_LITERAL = re.compile(r"Literal\[([^\]]*)\]")
#: How Lightning's TensorBoardLogger says that neither tensorboard nor tensorboardX is installed.
_NO_TENSORBOARD = "Neither `tensorboard` nor `tensorboardX` is available"


@dataclass
class _Reason:
    keys: tuple[str, ...]
    text: str
    depth: int


def explain(message: str, drop_keys: tuple[str, ...] = ()) -> str:
    """The one-line summary of a jsonargparse error ``message``; ``drop_keys``: leading keys the caller names."""
    lines = [line for line in message.splitlines() if line.strip()]
    if not lines:
        return message
    if _is_yaml_error(message):
        return _yaml_reason(lines)
    reason = _deepest_reason(lines)
    keys = reason.keys if reason else _keys_of(lines)
    keys = keys[len(drop_keys) :] if keys[: len(drop_keys)] == drop_keys else keys
    text = reason.text if reason else _accepted_values(lines)
    if not keys:
        return text
    return f"bad value for `{'.'.join(keys)}`: {text}"


def _deepest_reason(lines: list[str]) -> _Reason | None:
    stack: list[tuple[int, str]] = []
    best: _Reason | None = None
    for line in lines:
        depth = len(line) - len(line.lstrip())
        text = line.strip().lstrip("- ").strip()
        while stack and stack[-1][0] >= depth:
            stack.pop()
        key = _KEY.match(text)
        if key:
            stack.append((depth, key.group("key")))
            text = key.group("rest")
            if not text:
                continue
        if _is_context(text) or (best is not None and depth <= best.depth):
            continue
        best = _Reason(tuple(name for _, name in stack), _tidy(text), depth)
    return best


def _keys_of(lines: list[str]) -> tuple[str, ...]:
    return tuple(match.group("key") for line in lines if (match := _KEY.match(line.strip())))


def _is_context(text: str) -> bool:
    if text.startswith("Expected a") and "Got value" not in text:
        return True  # one Union alternative that did not match, not the reason
    return text.startswith(_CONTEXT) or text.startswith("Given value:")


def _accepted_values(lines: list[str]) -> str:
    given = next((line.strip()[len("Given value:") :].strip() for line in lines if "Given value:" in line), "?")
    subtypes = next((line for line in lines if "Subtypes:" in line), "")
    choices = [value.strip() for group in _LITERAL.findall(subtypes) for value in group.split(",") if value.strip()]
    if not choices:
        types = [name for name in re.findall(r"<class '([\w.]+)'>", subtypes) if name != "NoneType"]
        expected = f"give a value of type {' or '.join(types)}" if types else "see `--help` for the accepted values"
        return f"{given} is not accepted: {expected}."
    optional = " (or null)" if "NoneType" in subtypes else ""
    return f"{given} is not accepted: use one of {', '.join(choices)}{optional}."


def _tidy(text: str) -> str:
    missing = re.match(r"No module named '([\w.]+)'", text)
    package = missing_app_package(missing.group(1)) if missing else None
    if package is not None:
        return str(app_extra_error(package, "the class"))
    if text.startswith(_NO_TENSORBOARD):
        return f"The TensorBoard logger needs 'tensorboard', which is not installed: run `{INSTALL_APP}`."
    if text.startswith("No module named"):
        return f"{text}: check the class_path (a full module path, e.g. lightning_zero.app.tasks.seq2seq.Seq2SeqTask)."
    if text.startswith("File does not exist"):
        return f"{text}: check the path."
    text = re.sub(r"<class '([\w.]+)'>", r"\1", text)
    text = re.sub(r"^Expected a typing\.Literal\[(.*)\]\. Got value: (.*)$", r"expected one of \1, got \2", text)
    return re.sub(r"^Expected a (\S+)\. Got value: (.*)$", r"expected \1, got \2", text)


def _is_yaml_error(message: str) -> bool:
    return "<unicode string>" in message or "while parsing" in message or "while scanning" in message


def _yaml_reason(lines: list[str]) -> str:
    where = next((line.strip() for line in lines if "line " in line and "column" in line), "")
    position = re.search(r"line (\d+), column (\d+)", where)
    problem = next(
        (line.strip() for line in lines if line.strip().startswith(("expected", "did not find", "found", "mapping"))),
        lines[0].strip(),
    )
    at = f" at line {position.group(1)}, column {position.group(2)}" if position else ""
    return f"not valid YAML{at}: {problem}; fix the syntax there."


def parse_error_line(message: str) -> str:
    """The one-line error for a failed parse of the command line or a ``--config`` file."""
    unrecognized = re.match(r"^unrecognized arguments: (.*)$", message.strip())
    if unrecognized:
        return f"unrecognized arguments: {unrecognized.group(1)}: check the spelling, `--help` lists the options."
    if "does not accept option" in message:
        return f"{message.strip()}: check the spelling, `--help` lists the options."
    if message.strip().startswith("Problems parsing config"):
        return f"config file: {explain(message)}"
    return explain(message)


_UNION_MARKERS = ("Does not validate against any of the Union subtypes", "Problem with given class_path")
#: Where Lightning checks the Trainer's arguments (and the fit loop its data against them): its errors there are
#: about the user's input. Lightning raises them as plain ValueError/MisconfigurationException, with no type of their
#: own, so where they are raised is the one way to tell them from a bug (which keeps its traceback).
_LIGHTNING_CHECKS = re.compile(
    r"lightning/(pytorch|fabric)/(trainer|accelerators|connector\.py|utilities/imports|plugins/precision"
    r"|loops/fit_loop\.py)"
)


def as_config_error(error: BaseException) -> LightningZeroError | None:
    """``error`` as one :class:`LightningZeroError` line when it is about the user's input, else ``None``.

    That is: a ``LightningZeroError`` somewhere in its chain; a jsonargparse Union/class_path failure (reported
    through its innermost reason); or an error raised where Lightning checks the Trainer's arguments.
    """
    for link in _chain(error):
        if isinstance(link, LightningZeroError):
            return link
    message = str(error)
    if any(marker in message for marker in _UNION_MARKERS):
        return ZeroConfigError(explain(message))
    if isinstance(error, MisconfigurationException) or _raised_in_lightning_checks(error):
        return ZeroConfigError(_with_trainer_fix(message))
    return None


#: The longest message: ``error: `` and it make a line of at most 300 characters.
MAX_MESSAGE = 293
_TRAINER_FIX = "fix that Trainer option in the config or on the command line."


def _with_trainer_fix(message: str) -> str:
    """Lightning's ``message`` ending in what to do; its longer messages say that themselves (their last
    sentence), so they are kept to the sentences that fit, the last one among them."""
    text = " ".join(message.split()).rstrip(".")
    if len(text) + len(_TRAINER_FIX) + 2 <= MAX_MESSAGE:
        return f"{text}: {_TRAINER_FIX}"
    sentences = [f"{sentence.rstrip('.')}." for sentence in re.split(r"(?<=\.) ", text)]
    kept = [sentences[0], sentences[-1]] if len(sentences) > 1 else sentences
    for sentence in sentences[1:-1]:
        if sum(len(part) + 1 for part in kept) + len(sentence) <= MAX_MESSAGE:
            kept.insert(-1, sentence)
    return " ".join(kept)[:MAX_MESSAGE]


def _chain(error: BaseException) -> list[BaseException]:
    links: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and all(current is not link for link in links):
        links.append(current)
        current = current.__cause__ or current.__context__
    return links


def _raised_in_lightning_checks(error: BaseException) -> bool:
    frames = traceback.extract_tb(error.__traceback__)
    return bool(frames) and _LIGHTNING_CHECKS.search(frames[-1].filename.replace("\\", "/")) is not None
