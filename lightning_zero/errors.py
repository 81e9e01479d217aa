"""The exception types users see for bad input: a one-line message that says what is wrong and what to do."""

from __future__ import annotations

import argparse
from typing import NoReturn

from lightning.fabric.utilities.exceptions import MisconfigurationException


class LightningZeroError(MisconfigurationException):
    """Base of lightning-zero's errors. The message is one line and says how to fix it; the CLI prints it as
    ``error: ...`` and exits with status 2."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


class ZeroConfigError(LightningZeroError):
    """Bad configuration: a setting, a strategy, a config file, a missing package."""


class ZeroDataError(LightningZeroError):
    """Bad or unusable data: a missing or malformed data file, a missing column or split, too little data."""


class CommandParser(argparse.ArgumentParser):
    """The argument parser of a lightning-zero command besides LightningCLI's (``prog`` is ``lightning-zero NAME``):
    a bad option is one :class:`ZeroConfigError` line pointing to ``--help``, where argparse would add its usage."""

    def error(self, message: str) -> NoReturn:
        raise ZeroConfigError(f"{self.prog.removeprefix('lightning-zero ')}: {message}: see `{self.prog} --help`.")
