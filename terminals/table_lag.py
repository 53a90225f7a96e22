"""How far the worker's tables are behind the internal topic: the broker's end offsets of the
partitions it owns against what its agent has applied (`table_lag`), asked in the background
(`EndOffsets`) so that the health timer never waits on the broker.

Why in the background: the health timer beats every second, and under a catch-up's load one
answer took just over a second, so the timer overlapped itself ("Timer report_progress is
overlapping") and its beat came late. The timer now takes the newest answer and starts the next
question when none is in flight. An answer older than `max_age_s` (asked that long ago) counts
as unknown, so a broker that stops answering makes the lag unknown and the worker not ready,
as a broker that does not answer in time did before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import faust
from aiokafka.errors import KafkaError

log = logging.getLogger(__name__)

#: How long one question for the end offsets may take.
END_OFFSETS_TIMEOUT_S = 5.0


async def end_offsets(app: faust.App, partitions: Sequence[Any]) -> dict[Any, int | None]:
    """The partitions' end offsets, asked of the broker; None for each when it does not answer
    within END_OFFSETS_TIMEOUT_S. Not the consumer's own high watermark: that is its last
    fetch's, which stops while its buffer is full (a catch-up), and a lag read from it looked
    small while thousands of records waited."""
    if not partitions:
        return {}
    try:
        found = await asyncio.wait_for(app.consumer.highwaters(*partitions), END_OFFSETS_TIMEOUT_S)
    except (TimeoutError, KafkaError) as exc:
        log.debug("end offsets of the internal topic not read: %s", exc)
        return dict.fromkeys(partitions)
    return {tp: found.get(tp) for tp in partitions}


class EndOffsets:
    """The newest answer to `end_offsets`, asked again in the background whenever `latest` is
    called with no question in flight, with what the agent had applied when it was asked: the
    lag is the answer's ends against that, both of one moment. Against what is applied by the
    time the answer is read, a catch-up, whose ends grow while the question is out, looked
    caught up early (a worker was ready with 35,000 transactions of a 500,000 backlog still to
    count). Call it from the event loop."""

    def __init__(
        self,
        app: faust.App,
        max_age_s: float = END_OFFSETS_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._app = app
        self._max_age_s = max_age_s
        self._clock = clock
        self._asking: asyncio.Task[None] | None = None
        self._answer: dict[Any, int | None] = {}
        self._applied: dict[int, int] = {}
        #: When the answer held was asked for (monotonic).
        self._asked_at = -float("inf")

    def latest(
        self, partitions: Sequence[Any], applied: dict[int, int]
    ) -> tuple[dict[Any, int | None], dict[int, int]]:
        """Each partition's end offset as the newest answer says it (None where that answer
        does not name it or was asked for more than `max_age_s` ago), and `applied` (per table
        partition, the next offset to apply) as it was when that answer was asked for."""
        if self._asking is None or self._asking.done():
            self._asking = asyncio.ensure_future(self._ask(list(partitions), dict(applied)))
        if self._clock() - self._asked_at > self._max_age_s:
            return dict.fromkeys(partitions), dict(applied)
        return {tp: self._answer.get(tp) for tp in partitions}, self._applied

    async def _ask(self, partitions: list[Any], applied: dict[int, int]) -> None:
        asked_at = self._clock()
        answer = await end_offsets(self._app, partitions)
        self._answer, self._applied, self._asked_at = answer, applied, asked_at


def table_lag(ends: dict[int, int | None], applied: dict[int, int]) -> int | None:
    """How many internal records the owned table partitions (`ends`: each one's end offset,
    None where the broker did not say) hold past what the agent applied (`applied`: the next
    offset to apply); None, so not ready, while that is not known: an end not known, or a
    partition with records that the agent has applied none of yet (the router sends every
    partition a record every few seconds)."""
    behind = 0
    for partition, high in ends.items():
        if high is None:
            return None
        if partition not in applied:
            if high > 0:
                return None
            continue
        behind += max(high - applied[partition], 0)
    return behind
