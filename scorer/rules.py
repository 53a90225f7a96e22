"""The decision step of the rules that overrule the model: deny and allow lists, thresholds per
segment, expression rules (docs/rules.md).

A `Rules` value is the rule set in force. It is read from a file at start-up (`Rules.load`),
changed by the records of a compacted topic (`Rules.with_update`; the two sources:
scorer/rule_sources.py), and turns a batch's model scores into decisions (`Rules.decide`; the
expressions: scorer/rule_expressions.py).

- Precedence per row: a deny-list hit declines; else an allow-list hit approves; else the score
  against the row's thresholds (the first segment override that matches, else the defaults),
  escalated to the most severe `then` of the expression rules that hit. A rule never approves.
- Immutable: every update makes a new value, so a batch is decided by one consistent set and a
  bad update (`RulesError`) leaves the previous set in force.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import msgspec
import numpy as np
import numpy.typing as npt

from contracts.decision import APPROVE, DECLINE, REVIEW
from plumbing.errors import ConfigurationError
from scorer.columns import TransactionColumns
from scorer.decisions import Thresholds, classify
from scorer.rule_expressions import Batch, RulesError
from scorer.rule_sources import (
    LIST_KINDS,
    MAX_NAMED_ENTRIES,
    NO_ENTRIES,
    Entries,
    FileSpec,
    Ids,
    OverrideChange,
    RuleChange,
    file_entries,
    put,
    read_document,
    topic_change,
)

__all__ = ["Rules", "RulesError", "RulesOutcome"]

_DECISIONS = np.array([APPROVE, REVIEW, DECLINE], dtype=object)
_DENY_LEVEL, _ALLOW_LEVEL = 2, 0
_ID_COLUMN = {
    "card": operator.attrgetter("card_id"),
    "merchant": operator.attrgetter("merchant_id"),
    "terminal": operator.attrgetter("terminal_id"),
}


class RulesOutcome(NamedTuple):
    """What the rules made of a batch."""

    #: The final decision of each row.
    decisions: list[str]
    #: The rules that hit each row, in precedence order; () where none.
    hits: list[tuple[str, ...]]
    #: Rows hit per rule name over the batch; names that hit no row are left out.
    counts: dict[str, int]


class Rules:
    """The rule set in force (deny and allow lists, segment overrides, expression rules) and how
    it turns a batch's scores into decisions. Immutable: `with_update` returns a new value."""

    EMPTY: ClassVar[Rules]
    __slots__ = ("_file", "_lists", "_overrides", "_rules", "_topic")

    def __init__(self, file: Entries, topic: Entries, lists: Mapping[tuple[str, str], Ids]) -> None:
        """`lists`: the ids in force, the file's and the topic's together."""
        self._file = file
        self._topic = topic
        self._lists = lists
        # A topic entry replaces the file's of its name; new names come after the file's.
        self._overrides = tuple({**file.overrides, **topic.overrides}.values())
        self._rules = tuple({**file.rules, **topic.rules}.values())

    @classmethod
    def load(cls, path: Path) -> Rules:
        """The rules of a TOML file, or of a YAML one (`.yaml`, `.yml`: the same tables as
        mappings and lists); ConfigurationError naming the file and the problem."""
        document = read_document(path)
        try:
            return cls.parse(document, f"rules file {path}")
        except RulesError as exc:
            raise ConfigurationError(str(exc)) from exc

    @classmethod
    def parse(cls, document: Mapping[str, Any], source: str) -> Rules:
        """The rules of a parsed TOML document; RulesError naming `source` and the problem."""
        try:
            file = file_entries(msgspec.convert(document, FileSpec))
        except (msgspec.ValidationError, RulesError) as exc:
            raise RulesError(f"{source}: {exc}") from None
        return cls(file, NO_ENTRIES, file.lists)

    def with_update(self, key: str, value: bytes | None) -> Rules:
        """These rules with one rules-topic record applied (value None: a tombstone).

        RulesError with a one-line reason for a record that cannot be applied; this value is
        unchanged either way.
        """
        try:
            change = topic_change(key, value)
        except RulesError as exc:
            raise RulesError(f"rules topic key {key!r}: {exc}") from None
        topic = self._topic
        if isinstance(change, OverrideChange):
            self._check_room(key, "override", change.name, change.override, self._file.overrides)
            topic = topic._replace(overrides=put(topic.overrides, change.name, change.override))
            return Rules(self._file, topic, self._lists)
        if isinstance(change, RuleChange):
            self._check_room(key, "rule", change.name, change.rule, self._file.rules)
            topic = topic._replace(rules=put(topic.rules, change.name, change.rule))
            return Rules(self._file, topic, self._lists)
        list_key, entry, present = change
        topic_lists = dict(topic.lists)
        topic_lists[list_key] = topic_lists[list_key].changed(entry, present)
        lists = dict(self._lists)
        file_ids = self._file.lists[list_key]
        if not file_ids:
            lists[list_key] = topic_lists[list_key]
        # A tombstone removes the topic's entry; the file's, if any, stays in force.
        elif present or entry not in file_ids:
            lists[list_key] = lists[list_key].changed(entry, present)
        return Rules(self._file, topic._replace(lists=topic_lists), lists)

    def _check_room(
        self, key: str, table: str, name: str, entry: object, file: Mapping[str, object]
    ) -> None:
        """Refuse a new name past MAX_NAMED_ENTRIES (replacing or removing one is fine)."""
        in_force = self._overrides if table == "override" else self._rules
        known = name in file or name in getattr(self._topic, f"{table}s")
        if entry is not None and not known and len(in_force) >= MAX_NAMED_ENTRIES:
            raise RulesError(
                f"rules topic key {key!r}: {len(in_force)} {table}s are in force already, the "
                f"most a rule set may hold is {MAX_NAMED_ENTRIES} {table}s"
            )

    def __len__(self) -> int:
        return sum(map(len, self._lists.values())) + len(self._overrides) + len(self._rules)

    def summary(self) -> str:
        """A count of the entries for logs: "2 deny, 1 allow, 1 override, 3 rules"."""
        deny, allow = (
            sum(len(self._lists[(action, kind)]) for kind in LIST_KINDS)
            for action in ("deny", "allow")
        )
        overrides, rules = len(self._overrides), len(self._rules)
        return (
            f"{deny} deny, {allow} allow, {overrides} override{'s' * (overrides != 1)}, "
            f"{rules} rule{'s' * (rules != 1)}"
        )

    def decide(
        self,
        columns: TransactionColumns,
        features: npt.NDArray[np.float32],
        scores: npt.NDArray[np.float32],
        thresholds: Thresholds,
    ) -> RulesOutcome:
        """The decision of each row under these rules, and which rules hit it.

        `features` is the batch's [B, F] matrix in catalogue order, `scores` the model's score
        per row, `thresholds` the defaults. Without rules this is `classify(scores, thresholds)`.
        """
        n = len(scores)
        if not (self._overrides or self._rules or any(self._lists.values())):
            return RulesOutcome(classify(scores, thresholds), [()] * n, {})
        names: list[str] = []
        hit_columns: list[npt.NDArray[np.bool_]] = []
        listed = {"deny": np.zeros(n, np.bool_), "allow": np.zeros(n, np.bool_)}
        for (action, kind), ids in self._lists.items():
            if ids:
                hit = ids.rows(_ID_COLUMN[kind](columns))
                listed[action] |= hit
                names.append(f"{action}:{kind}")
                hit_columns.append(hit)
        review: Any = thresholds.review
        decline: Any = thresholds.decline
        if self._overrides:
            # float32 like the scores, so a row without an override is cut exactly as `classify`.
            review = np.full(n, review, np.float32)
            decline = np.full(n, decline, np.float32)
            taken = np.zeros(n, np.bool_)
            for override in self._overrides:
                hit = override.matches(columns) & ~taken
                review[hit] = override.thresholds.review
                decline[hit] = override.thresholds.decline
                taken |= hit
                names.append(f"override:{override.name}")
                hit_columns.append(hit)
        level = (scores >= review).astype(np.intp) + (scores >= decline)
        if self._rules:
            batch = Batch(columns, features)
            with np.errstate(all="ignore"):
                for rule in self._rules:
                    hit = rule.test(batch)
                    if np.ndim(hit) == 0:  # a rule of constants only
                        hit = np.full(n, hit, np.bool_)
                    np.maximum(level, hit * rule.level, out=level)
                    names.append(f"rule:{rule.name}")
                    hit_columns.append(hit)
        level[listed["allow"]] = _ALLOW_LEVEL
        level[listed["deny"]] = _DENY_LEVEL
        decisions: list[str] = _DECISIONS[level].tolist()
        hits, counts = _hits(names, hit_columns, n)
        return RulesOutcome(decisions, hits, counts)


def _hits(
    names: list[str], columns: list[npt.NDArray[np.bool_]], n: int
) -> tuple[list[tuple[str, ...]], dict[str, int]]:
    """Per row, the names whose column is set (in `names` order); and the rows per name."""
    matrix = np.column_stack(columns)
    counts = {
        name: total for name, total in zip(names, matrix.sum(axis=0).tolist(), strict=True) if total
    }
    hits: list[tuple[str, ...]] = [()] * n
    rows, cols = np.nonzero(matrix)  # row-major: by row, then in precedence order
    if rows.size:
        hit_names = np.array(names, dtype=object)[cols].tolist()
        starts = [0, *(np.flatnonzero(np.diff(rows)) + 1).tolist()]
        stops = [*starts[1:], len(hit_names)]
        for row, start, stop in zip(rows[starts].tolist(), starts, stops, strict=True):
            hits[row] = tuple(hit_names[start:stop])
    return hits, counts


Rules.EMPTY = Rules(NO_ENTRIES, NO_ENTRIES, NO_ENTRIES.lists)
