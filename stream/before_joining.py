"""What a replica does before it joins its consumer group, so that it never scores without what
it needs: the control topics (the rules topic, terminal-risk, card-frauds) read to their end,
and, with FRAUD_STATE_WARM_UP, the card state of every partition read ahead.

The replica is not ready meanwhile, however long it takes, and its health beats on; a stop
ends either wait. `stream/service.py` calls both before it subscribes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Protocol

from confluent_kafka import KafkaException

from plumbing.health import HealthState
from stream.owned_card_history import OwnedCardHistory

log = logging.getLogger(__name__)


class _Stopped(Exception):
    """Raised inside the card state's warm-up when the replica is told to stop."""


class ControlTable(Protocol):
    """A table a replica reads whole from a control topic before it consumes."""

    loaded: threading.Event

    @property
    def problem(self) -> str | None: ...

    def start(self) -> None: ...

    def stopped(self) -> str | None: ...


def wait_for_control_topics(
    candidates: Sequence[tuple[str, ControlTable | None]],
    health: HealthState,
    stopping: threading.Event,
    *,
    timeout_s: float,
    poll_s: float,
) -> None:
    """Read the control topics (`candidates`: each table by name, None when not used) up to
    their end before consuming, so that no replica scores without them: not ready, and nothing
    consumed, until then, however long it takes (a stop ends the wait; it is looked for every
    `poll_s`). Past `timeout_s` (FRAUD_TERMINAL_RISK_LOAD_TIMEOUT_S) an error says which one is
    waited for, and why. From their start on, a reader whose thread ended makes the replica not
    alive (it would score with a table that no longer follows its topic): restarted, it reads
    them anew."""
    tables = [(name, table) for name, table in candidates if table is not None]
    for _, table in tables:
        table.start()
    health.watch(lambda: _stopped_reader(tables))
    deadline = time.monotonic() + timeout_s
    overdue_told = False
    while not stopping.is_set():
        waiting = [(name, table) for name, table in tables if not table.loaded.is_set()]
        if not waiting:
            return
        name, table = waiting[0]
        problem = table.problem
        health.beat()
        health.set_ready(False, f"loading {name}" + (f": {problem}" if problem else ""))
        if not overdue_told and time.monotonic() >= deadline:
            overdue_told = True
            log.error(
                "%s not read to its end within %ss (%s): the replica consumes nothing, "
                "and is not ready, until it is",
                name,
                timeout_s,
                problem or "still reading",
            )
        table.loaded.wait(poll_s)


def warm_up_card_history(
    state: OwnedCardHistory, health: HealthState, stopping: threading.Event
) -> None:
    """FRAUD_STATE_WARM_UP: read every partition's card state before joining the group, so
    the partitions given to this replica read only the changelog written since (not ready
    meanwhile; a stop ends it)."""

    def progress() -> None:
        health.beat()
        if stopping.is_set():
            raise _Stopped

    health.set_ready(False, "warming up the card state")
    started = time.monotonic()
    try:
        state.warm_up(progress)
    except _Stopped:
        return
    except (KafkaException, RuntimeError, TimeoutError) as exc:
        # The partitions read whole are kept; the others restore whole once given.
        log.warning("card state warm-up failed (%s): joining without the rest of it", exc)
        return
    log.info("card state warmed up in %.3fs: joining the group", time.monotonic() - started)


def _stopped_reader(tables: list[tuple[str, ControlTable]]) -> str | None:
    """Why the replica is not alive when a control topic's reader has stopped; else None."""
    for name, table in tables:
        why = table.stopped()
        if why is not None:
            return f"the reader of {name} stopped ({why}): nothing more of it is read"
    return None
