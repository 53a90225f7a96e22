"""In-memory stand-ins for the scorer and the output sink (never for Kafka in integration tests)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt
from confluent_kafka import Message

from contracts.errors import ScoreError
from stream.outcomes import OutcomeGroup
from stream.sink import Output


class FakeScorer:
    """Scores rows with a fixed rule; raises or returns NaN for rows a test marks as poison."""

    model_version = "fake-1"

    def __init__(
        self,
        rule: Callable[[npt.NDArray[np.float32]], npt.NDArray[np.float32]] | None = None,
        raises_on: Callable[[npt.NDArray[np.float32]], npt.NDArray[np.bool_]] | None = None,
        broken: bool = False,
    ) -> None:
        self._rule = rule or (lambda f: (f[:, 0] / (1.0 + f[:, 0])).astype(np.float32))
        self._raises_on = raises_on
        self.broken = broken
        self.calls: list[int] = []

    def warm_up(self) -> float:
        return 0.0

    def score(self, features: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        self.calls.append(len(features))
        if self.broken:
            raise ScoreError("CUDA error: device lost")
        if self._raises_on is not None and self._raises_on(features).any():
            raise ScoreError("Gather: index out of bounds")
        return self._rule(features)


class MemorySink:
    """Keeps outputs; delivers them on `deliver()` or fails them through `on_failure`."""

    def __init__(self) -> None:
        self.sent: list[Output] = []

    def send(self, output: Output) -> None:
        self.sent.append(output)

    def send_decisions(
        self,
        topic: str,
        keys: list[bytes],
        values: list[bytes],
        group: OutcomeGroup,
        output_of: Callable[[int], Output],
    ) -> None:
        self.sent.extend(output_of(i) for i in range(len(values)))

    def deliver_all(self) -> None:
        for output in self.sent:
            output.delivered()
        self.sent = []

    def poll(self) -> None:
        """Nothing to serve: deliveries happen when the test says."""

    def flush(self, timeout_s: float) -> int:
        return len(self.sent)


def message(
    offset: int,
    value: bytes = b"{}",
    partition: int = 0,
    topic: str = "tx",
    key: bytes = b"card",
    headers: list[tuple[str, bytes]] | None = None,
) -> Message:
    return Message(
        topic=topic,
        partition=partition,
        offset=offset,
        key=key,
        value=value,
        headers=[("trace", b"t-1")] if headers is None else headers,
        timestamp=(1, 1_000),
    )
