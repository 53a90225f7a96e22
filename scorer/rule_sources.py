"""The rule set's entries as its two sources give them: the rules file (TOML, or YAML) read at
start-up, and the records of the compacted rules topic, each a change to the topic's own layer
(docs/rules.md).

- The topic is a layer over the file: a topic override or rule replaces the file's of the same
  name (new names come after the file's), and a tombstone removes the topic's entry only. A
  restart (the file, then the compacted topic replayed, its tombstones possibly compacted away)
  therefore reaches the set the live updates did.
- An update copies only what it changes, and an id list in O(√n) (`Ids`), so replaying a
  compacted topic of n list entries does not copy the lists n times.
- Bounded, so that no record or file costs much more to hold and to apply than its bytes: a
  topic record's size (refused before it is parsed) and its key, a file's size, and the number
  of rules and of overrides (the expressions' own bounds: scorer/rule_expressions.py).
- A topic record's value may say its format (`format_version`, contracts/record_format.py);
  absent, it is 1. One of a newer format is refused as any record that cannot be used: its
  fields may mean what this release does not know. While the format is 1 the field is left
  out: release 0.1.0 refuses a rule or override with a field it does not know, so a record
  that says `"format_version": 1` would be refused by a replica rolled back to it.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import msgspec
import numpy as np
import numpy.typing as npt

from contracts.decision import DECLINE, REVIEW
from contracts.record_format import FIRST_FORMAT, check_format
from contracts.reference_data import MCC_FAMILIES
from contracts.transaction import MAX_ID_CHARS
from plumbing.bounded_read import read_bounded
from plumbing.errors import ConfigurationError
from scorer.columns import TransactionColumns
from scorer.decisions import Thresholds
from scorer.rule_expressions import Condition, RulesError, compile_condition, is_in

#: The newest format of a rules-topic record this release reads (contracts/record_format.py).
#: Its writers (operators, `kcat`) leave the field out while it is 1: see the module docstring.
FORMAT = 1
#: A rules file with one of these suffixes is YAML; any other is TOML.
YAML_SUFFIXES = (".yaml", ".yml")
#: A rules-topic record's value may hold this many bytes; a larger one is refused before it is
#: parsed. A rule with MAX_MEMBERS members of 4 digits fits in half of it.
MAX_UPDATE_BYTES = 16_384
#: A rules-topic key: `deny:merchant:` and an id of MAX_ID_CHARS characters fit.
MAX_KEY_CHARS = 128
#: A key longer than this is refused before it is decoded (UTF-8 takes up to 4 bytes a
#: character).
MAX_KEY_BYTES = 4 * MAX_KEY_CHARS
#: A rules file may hold this many bytes (16 MiB: about 200,000 list ids); a larger one is
#: refused before it is read.
MAX_RULES_FILE_BYTES = 16 * 1024 * 1024
#: Rules in force, and overrides in force (the file's and the topic's together), each: every
#: batch evaluates them all, and each name is a `rule` value of fraud_rule_hits_total.
MAX_NAMED_ENTRIES = 100
#: A rule's or an override's name.
MAX_NAME_CHARS = 64

_LEVEL_OF_THEN = {REVIEW: 1, DECLINE: 2}
LIST_KINDS = ("card", "merchant", "terminal")
#: Every list as (action, kind), in precedence order: hits are recorded in this order.
LISTS: tuple[tuple[str, str], ...] = tuple(
    (action, kind) for action in ("deny", "allow") for kind in LIST_KINDS
)
_CHANNELS = ("pos", "ecom", "atm")
_COUNTRY = re.compile(r"[A-Z]{2}")
#: An id list keeps up to this many changes (plus √n) beside its base before rebuilding it.
_MIN_CHANGES_KEPT = 64


class Override(NamedTuple):
    """Thresholds for one segment; `None` fields match every row."""

    name: str
    thresholds: Thresholds
    channel: str | None
    mcc_codes: npt.NDArray[np.int64] | None
    country: str | None

    def matches(self, columns: TransactionColumns) -> npt.NDArray[np.bool_]:
        match = np.ones(len(columns.amount), np.bool_)
        if self.channel is not None:
            match &= columns.channel == self.channel
        if self.mcc_codes is not None:
            match &= is_in(columns.mcc, self.mcc_codes)
        if self.country is not None:
            match &= columns.country == self.country
        return match


class Rule(NamedTuple):
    name: str
    level: int
    test: Condition


@dataclass(frozen=True, slots=True)
class Ids:
    """An immutable set of ids that a change copies in O(√n), not O(n): a base set, rebuilt
    rarely, and the few ids added to it or removed from it since."""

    base: frozenset[str] = frozenset()
    #: Not in `base`.
    added: frozenset[str] = frozenset()
    #: In `base`.
    removed: frozenset[str] = frozenset()

    def __len__(self) -> int:
        return len(self.base) - len(self.removed) + len(self.added)

    def __contains__(self, entry: object) -> bool:
        return entry in self.added or (entry in self.base and entry not in self.removed)

    def changed(self, entry: str, present: bool) -> Ids:
        """These ids with `entry` added (`present`) or removed."""
        if (entry in self) == present:
            return self
        added, removed = self.added, self.removed
        if entry in self.base:
            removed = removed - {entry} if present else removed | {entry}
        else:
            added = added | {entry} if present else added - {entry}
        # Rebuilding the base costs O(n) once per about √n changes: O(√n) a change, amortised.
        if len(added) + len(removed) > _MIN_CHANGES_KEPT + math.isqrt(len(self.base)):
            return Ids((self.base - removed) | added)
        return Ids(self.base, added, removed)

    def rows(self, ids: Sequence[str | None]) -> npt.NDArray[np.bool_]:
        """Which of `ids` are in the set."""
        n = len(ids)
        found = np.fromiter(map(self.base.__contains__, ids), np.bool_, n)
        if self.removed:
            found &= ~np.fromiter(map(self.removed.__contains__, ids), np.bool_, n)
        if self.added:
            found |= np.fromiter(map(self.added.__contains__, ids), np.bool_, n)
        return found


class _ListsSpec(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    cards: tuple[str, ...] = ()
    merchants: tuple[str, ...] = ()
    terminals: tuple[str, ...] = ()


class _OverrideSpec(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    review: float
    decline: float
    channel: str | None = None
    mcc_family: str | None = None
    country: str | None = None


class _NamedOverrideSpec(_OverrideSpec, frozen=True, kw_only=True):
    name: str


class _RuleSpec(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    when: str
    then: str


class _NamedRuleSpec(_RuleSpec, frozen=True, kw_only=True):
    name: str


class _TopicOverrideSpec(_OverrideSpec, frozen=True, kw_only=True):
    """An override as a topic record gives it: the file's fields, and its format."""

    format_version: int = FIRST_FORMAT


class _TopicRuleSpec(_RuleSpec, frozen=True, kw_only=True):
    """A rule as a topic record gives it: the file's fields, and its format."""

    format_version: int = FIRST_FORMAT


class _Format(msgspec.Struct, frozen=True):
    """A topic record's format alone, whatever else it holds (checked before its fields)."""

    format_version: Any = FIRST_FORMAT


class FileSpec(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    deny: _ListsSpec = msgspec.field(default_factory=_ListsSpec)
    allow: _ListsSpec = msgspec.field(default_factory=_ListsSpec)
    override: tuple[_NamedOverrideSpec, ...] = ()
    rule: tuple[_NamedRuleSpec, ...] = ()


def _override(name: str, spec: _OverrideSpec) -> Override:
    where = f"override {name!r}"
    if not 0.0 <= spec.review <= spec.decline <= 1.0:
        raise RulesError(
            f"{where}: need 0 <= review <= decline <= 1, got review={spec.review} "
            f"decline={spec.decline}"
        )
    if spec.channel is None and spec.mcc_family is None and spec.country is None:
        raise RulesError(
            f"{where}: names no segment; give channel, mcc_family or country "
            "(the default thresholds are a setting)"
        )
    if spec.channel is not None and spec.channel not in _CHANNELS:
        raise RulesError(
            f"{where}: channel must be one of {', '.join(_CHANNELS)}, got {spec.channel!r}"
        )
    if spec.mcc_family is not None and spec.mcc_family not in MCC_FAMILIES:
        raise RulesError(
            f"{where}: mcc_family must be one of {', '.join(MCC_FAMILIES)}, got {spec.mcc_family!r}"
        )
    if spec.country is not None and not _COUNTRY.fullmatch(spec.country):
        raise RulesError(f"{where}: country must be 2 upper-case letters, got {spec.country!r}")
    codes = None
    if spec.mcc_family is not None:
        codes = np.array(MCC_FAMILIES[spec.mcc_family], np.int64)
    return Override(name, Thresholds(spec.review, spec.decline), spec.channel, codes, spec.country)


def _rule(name: str, spec: _RuleSpec) -> Rule:
    level = _LEVEL_OF_THEN.get(spec.then)
    if level is None:
        raise RulesError(
            f"rule {name!r}: then must be review or decline, got {spec.then!r} "
            "(a rule only escalates; approve through [allow])"
        )
    try:
        test = compile_condition(spec.when.strip())
    except RulesError as exc:
        raise RulesError(f"rule {name!r}: {exc}") from None
    return Rule(name, level, test)


class Entries(NamedTuple):
    """The entries of one source, the file or the topic; overrides and rules in their order."""

    lists: Mapping[tuple[str, str], Ids]
    overrides: Mapping[str, Override]
    rules: Mapping[str, Rule]


NO_ENTRIES = Entries({key: Ids() for key in LISTS}, {}, {})


def file_entries(spec: FileSpec) -> Entries:
    lists: dict[tuple[str, str], Ids] = {}
    for action, table in (("deny", spec.deny), ("allow", spec.allow)):
        kinds = zip(LIST_KINDS, (table.cards, table.merchants, table.terminals), strict=True)
        for kind, ids in kinds:
            if "" in ids:
                raise RulesError(f"[{action}] {kind}s: an id is empty")
            longest = max(ids, key=len, default="")
            if len(longest) > MAX_ID_CHARS:
                raise RulesError(f"[{action}] {kind}s: {_too_long_id(longest)}")
            lists[(action, kind)] = Ids(frozenset(ids))
    for named, count in (("override", len(spec.override)), ("rule", len(spec.rule))):
        if count > MAX_NAMED_ENTRIES:
            raise RulesError(
                f"[[{named}]]: {count:,} of them, more than the "
                f"{MAX_NAMED_ENTRIES} {named}s a rule set may hold"
            )
    overrides: dict[str, Override] = {}
    for override in spec.override:
        _check_new_name("override", override.name, overrides)
        overrides[override.name] = _override(override.name, override)
    rules: dict[str, Rule] = {}
    for rule in spec.rule:
        _check_new_name("rule", rule.name, rules)
        rules[rule.name] = _rule(rule.name, rule)
    return Entries(lists, overrides, rules)


def _too_long_id(entry_id: str) -> str:
    return (
        f"an id of {len(entry_id):,} characters: ids are at most {MAX_ID_CHARS} characters "
        "(the transaction contract's)"
    )


def _too_long_name(name: str) -> str:
    return f"a name of {len(name):,} characters: names are at most {MAX_NAME_CHARS} characters"


def _check_new_name(table: str, name: str, seen: Mapping[str, object]) -> None:
    if not name:
        raise RulesError(f"[[{table}]]: name is empty")
    if len(name) > MAX_NAME_CHARS:
        raise RulesError(f"[[{table}]]: {_too_long_name(name)}")
    if name in seen:
        raise RulesError(f"[[{table}]] {name!r} is defined twice")


class ListChange(NamedTuple):
    key: tuple[str, str]
    entry_id: str
    present: bool


class OverrideChange(NamedTuple):
    name: str
    override: Override | None


class RuleChange(NamedTuple):
    name: str
    rule: Rule | None


Change = ListChange | OverrideChange | RuleChange
_Spec = TypeVar("_Spec")
_Entry = TypeVar("_Entry")


def _decode(value: bytes, spec: type[_Spec]) -> _Spec:
    """A topic record's value as `spec`, once its format is one this release reads (before its
    fields: a newer format's may be unknown here); RulesError if it cannot be used."""
    found = _decode_only(value, _Format).format_version
    try:
        check_format(found, "rules-topic", FORMAT)
    except ValueError as exc:
        raise RulesError(str(exc)) from None
    return _decode_only(value, spec)


def _decode_only(value: bytes, spec: type[_Spec]) -> _Spec:
    try:
        return msgspec.json.decode(value, type=spec)
    except msgspec.DecodeError as exc:
        raise RulesError(f"bad value: {exc}") from None


def topic_key(key: bytes | None) -> str:
    """A rules-topic record's key as the rules know it; RulesError if it cannot be one."""
    if key is None:
        raise RulesError("a rules update needs a key, e.g. deny:card:<card id>")
    if len(key) > MAX_KEY_BYTES:
        raise RulesError(f"the key holds {len(key):,} bytes, over {MAX_KEY_BYTES}")
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RulesError(f"the key is not UTF-8: {exc}") from exc


def topic_change(key: str, value: bytes | None) -> Change:
    """A topic record → the change it makes, checked; an oversized one before it is parsed."""
    if len(key) > MAX_KEY_CHARS:
        raise RulesError(f"the key holds {len(key):,} characters, over {MAX_KEY_CHARS}")
    if value is not None and len(value) > MAX_UPDATE_BYTES:
        raise RulesError(
            f"the value holds {len(value):,} bytes, over the {MAX_UPDATE_BYTES:,} bytes a rules "
            "update may hold"
        )
    kind, _, rest = key.partition(":")
    if kind in ("deny", "allow"):
        list_kind, colon, entry_id = rest.partition(":")
        if list_kind not in LIST_KINDS or not colon:
            raise RulesError(
                f"{kind} keys are {kind}:card:<id>, {kind}:merchant:<id> or {kind}:terminal:<id>"
            )
        if not entry_id:
            raise RulesError("the id is empty")
        if len(entry_id) > MAX_ID_CHARS:
            raise RulesError(_too_long_id(entry_id))
        if value is not None:  # free-form (a reason, who listed it): checked, not read, so
            _decode_only(value, dict[str, Any])  # no format changes whether the id is listed
        return ListChange((kind, list_kind), entry_id, value is not None)
    if kind in ("override", "rule") and not rest:
        raise RulesError(f"the {kind} name is empty")
    if len(rest) > MAX_NAME_CHARS:
        raise RulesError(_too_long_name(rest))
    if kind == "override":
        override = None if value is None else _override(rest, _decode(value, _TopicOverrideSpec))
        return OverrideChange(rest, override)
    if kind == "rule":
        rule = None if value is None else _rule(rest, _decode(value, _TopicRuleSpec))
        return RuleChange(rest, rule)
    raise RulesError("keys start with deny:, allow:, override: or rule:")


def put(table: Mapping[str, _Entry], name: str, entry: _Entry | None) -> dict[str, _Entry]:
    """A copy of `table` with `entry` under `name` (in place of an entry of that name), or
    without `name` where `entry` is None."""
    copy = dict(table)
    if entry is None:
        copy.pop(name, None)
    else:
        copy[name] = entry
    return copy


def read_document(path: Path) -> Mapping[str, Any]:
    """A rules file's document: TOML, or YAML (`.yaml`, `.yml`: the same tables as mappings and
    lists); ConfigurationError naming the file and the problem."""
    try:
        text = read_bounded(
            path,
            MAX_RULES_FILE_BYTES,
            f"rules file {path}",
            "the most a rules file may hold; keep long lists on the rules topic",
        )
    except OSError as exc:
        raise ConfigurationError(f"rules file {path}: cannot read it: {exc.strerror}") from exc
    try:
        if path.suffix in YAML_SUFFIXES:
            return _yaml_document(path, text)
        return tomllib.loads(text.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"rules file {path}: not valid TOML: {exc}") from exc
    except RecursionError:
        raise ConfigurationError(f"rules file {path}: nested too deep") from None


def _yaml_document(path: Path, text: bytes) -> Mapping[str, Any]:
    """A YAML rules file as the mapping a TOML one parses to. PyYAML is the `yaml` extra: the
    service needs it only for such a file."""
    try:
        import yaml
    except ModuleNotFoundError:
        raise ConfigurationError(
            f"rules file {path}: reading YAML needs PyYAML: pip install 'fraud-scorer[yaml]', "
            "or write the rules as TOML"
        ) from None
    # libyaml's loader where PyYAML has it: about 20 times faster on a long file.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        document = yaml.load(text, Loader=loader)
    except yaml.YAMLError as exc:
        raise ConfigurationError(f"rules file {path}: not valid YAML: {exc}") from exc
    if document is None:  # an empty file: no rules, as an empty TOML file
        return {}
    if not isinstance(document, dict):
        raise ConfigurationError(f"rules file {path}: a YAML rules file is a mapping of tables")
    return document
