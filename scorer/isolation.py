"""Poison isolation: when deciding a batch raises, find the records to blame by bisection.

A batch whose work raises (building its columns or features, the model call, anything on the
way to a decision) is split in halves, recursively, until the failing records stand alone;
their batch-mates are decided as usual. Before a lone record is blamed, a known-good canary row
is scored: if the canary fails too, the model is broken for every input and no record is at
fault (`ModelUnavailableError`). Cost: about 2·k·log2(B) extra attempts for k poison records
in a batch of B, and nothing at all while every record behaves.

The scoring thread never dies because of what a record contains: every `Exception` a record
can provoke ends here as that record's `ScoreError`, with the original exception as its cause.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

from contracts.errors import ModelUnavailableError, ScoreError
from scorer.decisions import valid_scores
from scorer.features import NUM_FEATURES
from scorer.model import Scorer

T = TypeVar("T")
R = TypeVar("R")

#: An all-zero row: every feature at a value the training data contains.
CANARY = np.zeros((1, NUM_FEATURES), np.float32)


def bisect_failures(
    items: Sequence[T],
    attempt: Callable[[Sequence[T]], R],
    check_model: Callable[[], None],
) -> tuple[list[tuple[int, R]], dict[int, ScoreError]]:
    """Run `attempt` over `items`, bisecting on failure.

    Returns the results of the parts that succeeded, each with the index of its first item (in
    order, covering every item not blamed), and the blamed items' errors by index.
    `ModelUnavailableError`, from `attempt` or from `check_model`, is not any record's fault:
    it propagates.
    """
    parts: list[tuple[int, R]] = []
    failed: dict[int, ScoreError] = {}

    def run(start: int, stop: int) -> None:
        try:
            parts.append((start, attempt(items[start:stop])))
        except ModelUnavailableError:
            raise
        except Exception as exc:
            if stop - start > 1:
                middle = (start + stop) // 2
                run(start, middle)
                run(middle, stop)
                return
            check_model()
            failed[start] = as_score_error(exc)

    if items:
        run(0, len(items))
    return parts, failed


def as_score_error(exc: Exception) -> ScoreError:
    """`exc` as the error a dead letter carries: a ScoreError, the original as its cause."""
    if isinstance(exc, ScoreError):
        return exc
    error = ScoreError(f"{type(exc).__name__}: {exc}")
    error.__cause__ = exc
    error.__traceback__ = exc.__traceback__
    return error


def check_canary(scorer: Scorer, error: BaseException | None = None) -> None:
    """Raise ModelUnavailableError unless the model scores the canary row properly."""
    try:
        canary = scorer.score(CANARY)
    except Exception as canary_error:
        raise ModelUnavailableError(f"the model fails on a known-good row: {canary_error}") from (
            error or canary_error
        )
    if len(canary) != 1 or not valid_scores(canary).all():
        raise ModelUnavailableError(f"the model scores a known-good row {canary!r}") from error
