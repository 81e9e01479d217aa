"""Keep library noise out of a command-line run: what a user needs (progress, metrics, our notices) stays.

Silenced while :func:`quiet_libraries` is active, unless ``verbose`` or Python's own ``-W`` options are given:
LightningCLI's warning about ``args`` (our entry point passes ``sys.argv`` on purpose), DeepSpeed's "unable to
detect accelerator" on CPU, torch's deprecation warnings for the collectives DeepSpeed and FairScale call
(hundreds per run), Lightning's tree-spec deprecation and its advertising tips, and transformers' load report
when all it lists is newly initialised weights (the head a fine-tune adds; one report per rank).
"""

from __future__ import annotations

import logging
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

_DEPRECATED_COLLECTIVES = (
    r".*torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor|_all_gather_base|_reduce_scatter_base)`? "
    r"is (deprecated|a private function)"
)

#: (message regex, category) of warnings that say nothing a user can act on.
NOISY_WARNINGS: tuple[tuple[str, type[Warning]], ...] = (
    (r"LightningCLI's args parameter is intended to run from within Python", UserWarning),
    (_DEPRECATED_COLLECTIVES, FutureWarning),
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", Warning),
)

#: logger name -> text of records that say nothing a user can act on.
NOISY_LOG_RECORDS: dict[str, tuple[str, ...]] = {
    "DeepSpeed": ("we were unable to detect it",),
    "lightning.fabric.utilities.rank_zero": ("💡 Tip:",),
    "lightning.pytorch.utilities.rank_zero": ("💡 Tip:",),
}


class _DropRecords(logging.Filter):
    def __init__(self, fragments: tuple[str, ...]) -> None:
        super().__init__()
        self.fragments = fragments

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(fragment in message for fragment in self.fragments)


class _DropRoutineLoadReports(logging.Filter):
    """Drops transformers' load report unless it lists unexpected, mismatched or converted weights."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return "LOAD REPORT" not in message or any(word in message for word in ("UNEXPECTED", "MISMATCH", "CONVERSION"))


@contextmanager
def quiet_libraries(verbose: bool = False) -> Iterator[None]:
    """Silence :data:`NOISY_WARNINGS`, :data:`NOISY_LOG_RECORDS` and routine load reports meanwhile; ``verbose``
    (or ``python -W``) keeps them."""
    if verbose or sys.warnoptions:
        yield
        return
    filters: dict[str, logging.Filter] = {name: _DropRecords(texts) for name, texts in NOISY_LOG_RECORDS.items()}
    filters["transformers.modeling_utils"] = _DropRoutineLoadReports()
    with warnings.catch_warnings():
        for pattern, category in NOISY_WARNINGS:
            warnings.filterwarnings("ignore", message=pattern, category=category)
        for name, log_filter in filters.items():
            logging.getLogger(name).addFilter(log_filter)
        try:
            yield
        finally:
            for name, log_filter in filters.items():
                logging.getLogger(name).removeFilter(log_filter)
