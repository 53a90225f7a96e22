"""Reading a process's `/metrics` (the Prometheus text format) the one way the project's tools
and tests read it: prometheus_client's own parser, which handles escaped label values, rather
than a split on spaces, braces and commas."""

from __future__ import annotations

import urllib.request
from typing import NamedTuple

from prometheus_client.parser import text_string_to_metric_families


class Sample(NamedTuple):
    """One sample line: its name (with `_total`, `_bucket` … as exposed), labels and value."""

    name: str
    labels: dict[str, str]
    value: float

    @property
    def key(self) -> str:
        """The sample as its line names it: `name` or `name{a="x",b="y"}`, labels in the
        order the line gives them."""
        if not self.labels:
            return self.name
        pairs = ",".join(f'{k}="{_escaped(v)}"' for k, v in self.labels.items())
        return f"{self.name}{{{pairs}}}"


def samples(text: str) -> list[Sample]:
    """Every sample of an exposition, in its order."""
    return [
        Sample(sample.name, dict(sample.labels), float(sample.value))
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


def by_key(text: str) -> dict[str, float]:
    """Every sample's value by `Sample.key`."""
    return {sample.key: sample.value for sample in samples(text)}


def totals(text: str) -> dict[str, float]:
    """Every sample name's value summed over its label values (a counter over its labels)."""
    summed: dict[str, float] = {}
    for sample in samples(text):
        summed[sample.name] = summed.get(sample.name, 0.0) + sample.value
    return summed


def scrape(url: str, timeout_s: float = 5.0) -> str:
    """The exposition served at `url` (a /metrics)."""
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return str(response.read().decode())


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
