"""The one exception type users see for bad input: a one-line message that names the fix."""

from __future__ import annotations

from lightning.fabric.utilities.exceptions import MisconfigurationException


class ZeroConfigError(MisconfigurationException):
    """Bad configuration. The message is one line and says how to fix it."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))
