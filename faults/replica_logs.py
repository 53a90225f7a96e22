"""What a replica's log says about its partitions and its card state restores.

The lines are the service's own: `stream/service.py` logs each partition revoked or lost and
each one resumed once its card state is loaded ("partition=N resumed: its card state loaded
X s after its assignment"); `stream/owned_card_history.py` logs each restore ("restored card state
topic=… partition=N cards=C changelog_records=R in X s", with "(kept cards, changelog read
from O)" before "in" when only the changelog's tail was read). Plain logic over the text,
unit-tested.
"""

from __future__ import annotations

import re
from typing import NamedTuple

#: The service's log line for partitions that went: "revoked t[0], t[3]: …" or "lost t[1]: …".
_MOVED = re.compile(r": (?:revoked|lost) (?P<what>.*)$")
_RESTORED = re.compile(
    r"restored card state topic=\S+ partition=(?P<partition>\d+) cards=(?P<cards>\d+) "
    r"changelog_records=(?P<records>\d+)(?P<kept> \(kept cards, changelog read from \d+\))? "
    r"in (?P<seconds>[\d.]+)s"
)
_RESUMED = re.compile(
    r"partition=(?P<partition>\d+) resumed: its card state loaded (?P<seconds>[\d.]+)s after "
    r"its assignment"
)


class Restore(NamedTuple):
    """One partition's card state restore: the cards it added, the changelog records it read,
    whether it read only the tail over cards kept since the partition went, and how long the
    read took."""

    partition: int
    cards: int
    records: int
    kept: bool
    seconds: float


class Resume(NamedTuple):
    """A restored partition resumed: seconds from its assignment (the restores before it in
    the queue included)."""

    partition: int
    seconds: float


def moved_away(log_text: str, topic: str) -> set[int]:
    """The partitions of `topic` the replica's log says were revoked from it or lost."""
    partition = re.compile(r"(?<![\w.-])" + re.escape(topic) + r"\[(\d+)\]")
    found: set[int] = set()
    for line in log_text.splitlines():
        moved = _MOVED.search(line)
        if moved is not None:
            found.update(int(p) for p in partition.findall(moved.group("what")))
    return found


def restores(log_text: str) -> list[Restore]:
    """Every card state restore the log reports, in its order."""
    return [
        Restore(
            int(m["partition"]),
            int(m["cards"]),
            int(m["records"]),
            m["kept"] is not None,
            float(m["seconds"]),
        )
        for m in _RESTORED.finditer(log_text)
    ]


def resumes(log_text: str) -> list[Resume]:
    """Every partition the log reports resumed once its card state was loaded, in its order."""
    return [Resume(int(m["partition"]), float(m["seconds"])) for m in _RESUMED.finditer(log_text)]
