"""The fault tier's broker (127.0.0.1:9292, faults/broker.py): started once for the tier when
it does not run yet, and stopped afterwards if this tier started it. Its tests kill it and start
it again."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from faults.broker import Broker


@pytest.fixture(scope="session")
def broker() -> Iterator[Broker]:
    broker = Broker()
    started = not broker.running
    broker.up()
    yield broker
    if started:
        broker.down()
