"""The failure policy, in one place: what is retried, what is dead-lettered, and how long to try.

- Permanent, record-level (decode, validation, a record that breaks the model, an output the
  broker rejects as too large or invalid): dead-lettered at once, never retried.
- Transient, infrastructure-level (broker unavailable, request time-outs, leader changes, a
  full produce queue, a missing or forbidden topic): retried with exponential backoff and
  jitter. While it lasts nothing is committed; good records are never dead-lettered for it.
  Past `RetryPolicy.attempts` the replica reports unready, stops fetching, and keeps retrying
  at the longest backoff, holding what it has uncommitted so that a restart re-reads it.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass

import tenacity

from plumbing.errors import TransientDeliveryError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetryPolicy:
    """Retries of transient faults: exponential backoff with jitter, a bounded number of tries."""

    attempts: int = 5
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 5.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {self.attempts}")
        if not 0 < self.initial_backoff_s <= self.max_backoff_s:
            raise ValueError(
                "backoffs must satisfy 0 < initial <= max, got "
                f"{self.initial_backoff_s} and {self.max_backoff_s}"
            )

    def backoff_s(self, attempt: int) -> float:
        """The wait after the `attempt`-th failure (from 1): doubling from initial_backoff_s,
        plus up to initial_backoff_s of jitter (replicas that failed together do not retry
        together), at most max_backoff_s."""
        doubled = self.initial_backoff_s * 2.0 ** min(attempt - 1, 62)
        return min(doubled + random.uniform(0.0, self.initial_backoff_s), self.max_backoff_s)

    def retrying(self, on_retry: Callable[[BaseException], None]) -> tenacity.Retrying:
        """A tenacity loop that retries TransientDeliveryError only, then re-raises it."""

        def before_sleep(state: tenacity.RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome else None
            if error is not None:
                on_retry(error)
                log.warning(
                    "retrying in %.2fs (attempt %s of %s): %s",
                    state.upcoming_sleep,
                    state.attempt_number,
                    self.attempts,
                    error,
                )

        return tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(TransientDeliveryError),
            wait=lambda state: self.backoff_s(state.attempt_number),
            stop=tenacity.stop_after_attempt(self.attempts),
            before_sleep=before_sleep,
            reraise=True,
        )
