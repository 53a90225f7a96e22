"""Poison isolation: when deciding a batch raises, find the records to blame by bisection.

A batch whose work raises (building its columns or features, the model call, anything on the
way to a decision) is split in halves, recursively, until the failing records stand alone;
their batch-mates are decided as usual. Before a lone record is blamed, a known-good canary is
scored: the all-zeros row, and the recent real rows some model decided (`scorer/recent_rows.py`)
where the caller keeps them. If the model fails the zeros row, or most of the recent rows, it
is broken for every input and no record is at fault (`ModelUnavailableError`): a model that
returns NaN for real transactions has its records decided by the fallback rules, not
dead-lettered. The canary is scored once per batch (`Canary`). `score_rows` says which rows a
model fails; the canary judges by it (most of the recent rows), and so does the check before a
model serves (`stream/package_check.py` `sanity_check`: every row). Cost: about 2·k·log2(B)
extra attempts for k poison records in a batch of B, and nothing at all while every record
behaves.

The scoring thread never dies because of what a record contains: every `Exception` a record
can provoke ends here as that record's `ScoreError`, with the original exception as its cause.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple, TypeVar

import numpy as np
import numpy.typing as npt

from plumbing.errors import ModelUnavailableError, ScoreError
from scorer.decisions import valid_scores
from scorer.features import NUM_FEATURES
from scorer.model import Scorer
from scorer.recent_rows import RecentRows

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


class RowScores(NamedTuple):
    """Which of some rows a model failed, and why the first one failed."""

    #: [n] True where the row got no probability: a score outside [0, 1] or NaN, a call that
    #: raised for it, or a call that returned the wrong number of scores.
    failed: npt.NDArray[np.bool_]
    #: The first failure in words ("" when none failed), and its exception when one was raised.
    why: str
    cause: Exception | None

    @property
    def failures(self) -> int:
        return int(self.failed.sum())


def score_rows(scorer: Scorer, rows: npt.NDArray[np.float32]) -> RowScores:
    """Score `rows` in one call and report which the model failed. When the call raises (ONNX
    Runtime fails a whole call for one row), each row is scored on its own to find them."""
    try:
        scores = scorer.score(rows)
    except Exception as exc:
        if len(rows) <= 1:
            return RowScores(np.ones(len(rows), bool), f"{type(exc).__name__}: {exc}", exc)
        parts = [score_rows(scorer, rows[i : i + 1]) for i in range(len(rows))]
        first = next((part for part in parts if part.failures), parts[0])
        return RowScores(np.concatenate([part.failed for part in parts]), first.why, first.cause)
    if len(scores) != len(rows):
        return RowScores(
            np.ones(len(rows), bool),
            f"{len(scores)} scores returned for {len(rows)} rows: one score per row is needed",
            None,
        )
    failed = ~valid_scores(scores)
    why = (
        f"a score of {float(scores[failed][0])}, not a probability in [0, 1]"
        if failed.any()
        else ""
    )
    return RowScores(failed, why, None)


def check_canary(
    scorer: Scorer, error: BaseException | None = None, known_good: RecentRows | None = None
) -> None:
    """Raise ModelUnavailableError unless the model scores the canary row properly and most of
    the `known_good` rows (recent real rows, where there are any) as probabilities."""
    canary = score_rows(scorer, CANARY)
    if canary.failures:
        raise ModelUnavailableError(f"the model fails on a known-good row: {canary.why}") from (
            error or canary.cause
        )
    rows = known_good.sample() if known_good is not None else None
    if rows is None or not len(rows):
        return
    recent = score_rows(scorer, rows)
    if recent.failures > len(rows) * MOST:
        raise ModelUnavailableError(
            f"the model fails {recent.failures} of the {len(rows)} recent rows other models scored"
            f" ({recent.why})"
        ) from (error or recent.cause)


#: The share of the known-good rows a model may fail and still be judged sound (the rows it
#: fails are then some records' fault, as a poison record is).
MOST = 0.5


class Canary:
    """`check_canary` of one model and one batch, asked at most once: a batch's isolation may
    ask before each lone record it blames."""

    def __init__(self, scorer: Scorer, known_good: RecentRows | None = None) -> None:
        self._scorer = scorer
        self._known_good = known_good
        self._broken: ModelUnavailableError | None = None
        self._asked = False

    def check(self, error: BaseException | None = None) -> None:
        """Raise ModelUnavailableError (with `error` as its cause) when the model is broken."""
        if not self._asked:
            self._asked = True
            try:
                check_canary(self._scorer, None, self._known_good)
            except ModelUnavailableError as broken:
                self._broken = broken
        if self._broken is not None:
            raise ModelUnavailableError(str(self._broken)) from (error or self._broken.__cause__)
