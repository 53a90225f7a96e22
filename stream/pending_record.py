"""`PendingRecord`: a consumed, valid transaction on its way through a micro-batch.

The consuming thread makes one of every record it decodes and validates, and everything after
it passes the same value along: the batcher, the scoring stage and the outputs it sends, and a
rebalance that releases the records of partitions gone. Its own module because all of them
need it, and none of them owns it.
"""

from __future__ import annotations

from typing import NamedTuple

from confluent_kafka import Message

from contracts.offsets import SourceOffset
from contracts.transaction import Transaction


class PendingRecord(NamedTuple):
    """A consumed, valid transaction waiting in a micro-batch."""

    message: Message
    transaction: Transaction
    #: Where it came from, as the offset tracker knows it.
    position: SourceOffset
