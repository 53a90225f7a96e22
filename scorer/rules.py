"""Rules that overrule the model: deny and allow lists, thresholds per segment, expression rules.

A `Rules` value is the rule set in force. It is read from a TOML file at start-up
(`Rules.load`), changed by the records of a compacted topic (`Rules.with_update`), and turns a
batch's model scores into decisions (`Rules.decide`). The formats are in docs/rules.md.

Responsibilities and decisions:

- Precedence per row: a deny-list hit declines; else an allow-list hit approves; else the score
  against the row's thresholds (the first segment override that matches, else the defaults),
  escalated to the most severe `then` of the expression rules that hit. A rule never approves.
- Expressions are parsed with `ast`, checked against a whitelist of nodes and typed (number,
  text, true/false) before anything runs, then compiled once into closures of numpy operations
  over the whole batch; user text is never evaluated. Every number is float64, so no literal
  can overflow an integer column. A comparison with NaN does not match (`!=` included), and a
  division by zero yields NaN, so a comparison reading it does not match either.
- Immutable: every update makes a new value, so a batch is decided by one consistent set and a
  bad update (`RulesError`) leaves the previous set in force.
- The topic is a layer over the file: a topic override or rule replaces the file's of the same
  name (new names come after the file's), and a tombstone removes the topic's entry only. A
  restart (the file, then the compacted topic replayed, its tombstones possibly compacted away)
  therefore reaches the set the live updates did.
- An update copies only what it changes, and an id list in O(√n) (`_Ids`), so replaying a
  compacted topic of n list entries does not copy the lists n times.
- Bounded, so that no record or file costs much more to hold and to apply than its bytes: a
  topic record's size (refused before it is parsed) and its key, a file's size, the members of
  an `in [...]` list, an expression's nodes, the number of rules and of overrides, and every
  text a rule compares (at most what its field can hold: an id is at most the transaction
  contract's MAX_ID_CHARS, `country` 2 characters). Text members are held as a set.
"""

from __future__ import annotations

import ast
import difflib
import functools
import math
import operator
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, NamedTuple, TypeVar

import msgspec
import numpy as np
import numpy.typing as npt

from contracts.bounded_read import read_bounded
from contracts.decision import APPROVE, DECLINE, REVIEW
from contracts.errors import ConfigurationError
from contracts.reference_data import MCC_FAMILIES
from contracts.transaction import MAX_ID_CHARS
from scorer.catalogue import BY_NAME, LOG1P_FEATURES
from scorer.columns import TransactionColumns
from scorer.decisions import Thresholds, classify
from scorer.history import MS_PER_DAY, MS_PER_HOUR

__all__ = ["Rules", "RulesError", "RulesOutcome"]

#: An expression may nest this deep. The compiled closures recurse once per level on every
#: batch; the bound keeps any accepted rule far from Python's recursion limit.
MAX_EXPRESSION_DEPTH = 64
#: A rules file with one of these suffixes is YAML; any other is TOML.
YAML_SUFFIXES = (".yaml", ".yml")
#: A rules-topic record's value may hold this many bytes; a larger one is refused before it is
#: parsed. A rule with MAX_MEMBERS members of 4 digits fits in half of it.
MAX_UPDATE_BYTES = 16_384
#: A rules-topic key: `deny:merchant:` and an id of MAX_ID_CHARS characters fit.
MAX_KEY_CHARS = 128
#: A rules file may hold this many bytes (16 MiB: about 200,000 list ids); a larger one is
#: refused before it is read.
MAX_RULES_FILE_BYTES = 16 * 1024 * 1024
#: Members of one `in [...]` list.
MAX_MEMBERS = 1_000
#: Nodes of one expression, not counting its lists' members: each is an array operation on
#: every batch.
MAX_EXPRESSION_NODES = 256
#: Rules in force, and overrides in force (the file's and the topic's together), each: every
#: batch evaluates them all, and each name is a `rule` value of fraud_rule_hits_total.
MAX_NAMED_ENTRIES = 100
#: A rule's or an override's name.
MAX_NAME_CHARS = 64

_DECISIONS = np.array([APPROVE, REVIEW, DECLINE], dtype=object)
_LEVEL_OF_THEN = {REVIEW: 1, DECLINE: 2}
_DENY_LEVEL, _ALLOW_LEVEL = 2, 0
_LIST_KINDS = ("card", "merchant", "terminal")
#: Every list as (action, kind), in precedence order: hits are recorded in this order.
_LISTS: tuple[tuple[str, str], ...] = tuple(
    (action, kind) for action in ("deny", "allow") for kind in _LIST_KINDS
)
_ID_COLUMN = {
    "card": operator.attrgetter("card_id"),
    "merchant": operator.attrgetter("merchant_id"),
    "terminal": operator.attrgetter("terminal_id"),
}
_CHANNELS = ("pos", "ecom", "atm")
_COUNTRY = re.compile(r"[A-Z]{2}")
#: The longest value each text field can hold (contracts/transaction.py): a longer text can
#: never match it. Any other text is at most an id's length.
_TEXT_WIDTH = {"country": 2, "currency": 3, "channel": 4}


class RulesError(ValueError):
    """A rules file or rules-topic record that cannot be used; the message says why in one line."""


class RulesOutcome(NamedTuple):
    """What the rules made of a batch."""

    #: The final decision of each row.
    decisions: list[str]
    #: The rules that hit each row, in precedence order; () where none.
    hits: list[tuple[str, ...]]
    #: Rows hit per rule name over the batch; names that hit no row are left out.
    counts: dict[str, int]


# --- expressions --------------------------------------------------------------------------------

_NUMBER, _TEXT, _FLAG = "a number", "text", "true/false"
#: A compiled (sub)expression: the batch → an array over its rows, or a scalar (a constant).
_Eval = Callable[["_Batch"], Any]
_FieldReader = Callable[[TransactionColumns], npt.NDArray[Any]]

#: The transaction's own fields, by name: their type and how to read them from the columns.
_FIELDS: dict[str, tuple[str, _FieldReader]] = {
    "amount": (_NUMBER, lambda c: c.amount),
    "mcc": (_NUMBER, lambda c: c.mcc.astype(np.float64)),
    "hour": (_NUMBER, lambda c: (c.local_time() % MS_PER_DAY // MS_PER_HOUR).astype(np.float64)),
    "country": (_TEXT, lambda c: c.country),
    "currency": (_TEXT, lambda c: c.currency),
    "channel": (_TEXT, lambda c: c.channel),
    "card_present": (_FLAG, lambda c: c.card_present),
}
_FEATURE_INDEX = {name: i for i, name in enumerate(BY_NAME)}
#: Every name an expression may read. `card_present` is both; the field (true/false) wins.
_NAME_TYPES = {name: _NUMBER for name in BY_NAME} | {name: t for name, (t, _) in _FIELDS.items()}
_BOOLEAN_NAMES = {"true": True, "false": False}
_REFUSED = {
    ast.Call: "a function call",
    ast.Attribute: "an attribute",
    ast.Subscript: "a subscript",
    ast.Lambda: "a lambda",
    ast.IfExp: "a conditional expression",
    ast.NamedExpr: "an assignment",
}
_ALLOWED = "rules allow only names, constants, comparisons, in [...], and/or/not and + - * /"
_ORDERING = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge}
#: Up to this many members, `in` compares every row with every member: cheaper than np.isin,
#: which sorts, for the short lists rules name.
_FEW_MEMBERS = 16
#: An id list keeps up to this many changes (plus √n) beside its base before rebuilding it.
_MIN_CHANGES_KEPT = 64
_ARITHMETIC = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


class _Batch:
    """The values one batch gives expression names, each computed once and only when read."""

    __slots__ = ("_columns", "_features", "_values")

    def __init__(self, columns: TransactionColumns, features: npt.NDArray[np.float32]) -> None:
        self._columns = columns
        self._features = features
        self._values: dict[str, npt.NDArray[Any]] = {}

    def value(self, name: str) -> npt.NDArray[Any]:
        value = self._values.get(name)
        if value is None:
            field = _FIELDS.get(name)
            if field is not None:
                value = field[1](self._columns)
            else:
                column = self._features[:, _FEATURE_INDEX[name]]
                value = _natural(column) if name in LOG1P_FEATURES else column.astype(np.float64)
            self._values[name] = value
        return value


def _natural(stored: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
    """x from a column stored as float32 log1p(x), so that rules read 3 transactions, not log1p(3).

    float32 keeps log1p(x) to within one unit in the last place, which expm1 turns into about
    (1 + x) * that unit: 6 reads back as 5.9999995. An integer within that distance is taken as
    the value, so `card_tx_1h >= 6` holds for a card with 6 transactions.
    """
    value = np.expm1(stored.astype(np.float64))
    nearest = np.rint(value)
    resolution = (1.0 + np.abs(value)) * np.spacing(np.abs(stored)).astype(np.float64)
    snapped: npt.NDArray[np.float64] = np.where(
        np.abs(value - nearest) <= resolution, nearest, value
    )
    return snapped


def _constant(value: object) -> _Eval:
    return lambda _batch: value


def _divide(a: Any, b: Any) -> Any:
    return np.where(b == 0, np.nan, np.divide(a, b))


def _not_equal(a: Any, b: Any) -> Any:
    # NaN != x is True in IEEE arithmetic; here a comparison with NaN never matches.
    return np.logical_and(np.not_equal(a, b), np.logical_and(a == a, b == b))


#: The members after `in`: a set of text, or an array of numbers or flags.
_Members = frozenset[str] | npt.NDArray[Any]


def _is_in(a: Any, members: _Members) -> Any:
    if isinstance(members, frozenset):
        if isinstance(a, str):  # a constant: 'NG' in [...]
            return np.bool_(a in members)
        column = np.asarray(a)
        found = np.fromiter(map(members.__contains__, column.ravel().tolist()), np.bool_)
        return found.reshape(column.shape)
    if len(members) > _FEW_MEMBERS:
        return np.isin(a, members)
    return (np.asarray(a)[..., np.newaxis] == members).any(axis=-1)


def _is_not_in(a: Any, members: _Members) -> Any:
    return np.logical_not(_is_in(a, members))


def _number_not_in(a: Any, members: _Members) -> Any:
    return np.logical_and(_is_not_in(a, members), a == a)


class _Compiler:
    """One rule's `when` → closures over a batch, refusing anything outside the language."""

    def __init__(self, text: str) -> None:
        self._text = text
        self._nodes = 0

    def condition(self) -> _Eval:
        try:
            tree = ast.parse(self._text, mode="eval")
        except SyntaxError as exc:
            raise RulesError(f"`when` is not an expression: {exc.msg}") from None
        except (ValueError, RecursionError, MemoryError) as exc:
            raise RulesError(f"`when` is not an expression: {type(exc).__name__}") from None
        kind, test = self._compile(tree.body, 0)
        if kind != _FLAG:
            raise self._refuse(tree.body, f"is {kind}, not a condition: compare it with something")
        return test

    def _segment(self, node: ast.AST) -> str:
        return " ".join((ast.get_source_segment(self._text, node) or ast.dump(node)).split())

    def _refuse(self, node: ast.AST, problem: str) -> RulesError:
        return RulesError(f"`{self._segment(node)}` {problem}")

    def _expect(self, node: ast.expr, depth: int, want: str, why: str) -> _Eval:
        kind, evaluate = self._compile(node, depth)
        if kind != want:
            raise self._refuse(node, f"is {kind}; {why}")
        return evaluate

    def _compile(self, node: ast.expr, depth: int) -> tuple[str, _Eval]:
        if depth > MAX_EXPRESSION_DEPTH:
            raise self._refuse(node, f"nests deeper than {MAX_EXPRESSION_DEPTH} levels")
        self._nodes += 1
        if self._nodes > MAX_EXPRESSION_NODES:
            raise RulesError(
                f"the expression has more than {MAX_EXPRESSION_NODES:,} names, constants and "
                "operations: split it into rules"
            )
        depth += 1
        if isinstance(node, ast.BoolOp):
            why = f"`{'and' if isinstance(node.op, ast.And) else 'or'}` joins conditions"
            parts = [self._expect(value, depth, _FLAG, why) for value in node.values]
            join = np.logical_and if isinstance(node.op, ast.And) else np.logical_or
            return _FLAG, lambda batch: functools.reduce(join, [part(batch) for part in parts])
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            inner = self._expect(node.operand, depth, _FLAG, "`not` negates a condition")
            return _FLAG, lambda batch: np.logical_not(inner(batch))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            inner = self._expect(node.operand, depth, _NUMBER, "unary minus needs a number")
            return _NUMBER, lambda batch: np.negative(inner(batch))
        if isinstance(node, ast.BinOp):
            return _NUMBER, self._arithmetic(node, depth)
        if isinstance(node, ast.Compare):
            return _FLAG, self._comparison(node, depth)
        if isinstance(node, ast.Name):
            return self._name(node)
        if isinstance(node, ast.Constant):
            kind, value = self._literal(node)
            return kind, _constant(value)
        if isinstance(node, ast.List | ast.Tuple):
            raise self._refuse(node, "is a list: a list may only follow `in` or `not in`")
        what = _REFUSED.get(type(node), f"a {type(node).__name__}")
        raise self._refuse(node, f"is not allowed ({what}): {_ALLOWED}")

    def _name(self, node: ast.Name) -> tuple[str, _Eval]:
        name = node.id
        if name in _BOOLEAN_NAMES:
            return _FLAG, _constant(np.bool_(_BOOLEAN_NAMES[name]))
        kind = _NAME_TYPES.get(name)
        if kind is None:
            close = difflib.get_close_matches(name, _NAME_TYPES, n=1)
            hint = f" (did you mean `{close[0]}`?)" if close else ""
            raise RulesError(
                f"`{name}` is not a name rules know{hint}: the names are the features of "
                f"docs/features.md and {', '.join(_FIELDS)}"
            )
        return kind, lambda batch: batch.value(name)

    def _literal(self, node: ast.expr) -> tuple[str, object]:
        """A constant's type and value (a negative number included)."""
        negative = isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub)
        constant = node.operand if isinstance(node, ast.UnaryOp) and negative else node
        value = constant.value if isinstance(constant, ast.Constant) else None
        if isinstance(value, bool) and not negative:
            return _FLAG, np.bool_(value)
        if isinstance(value, int | float) and not isinstance(value, bool):
            try:
                number = np.float64(value)
            except OverflowError:
                raise self._refuse(node, "is too large a number") from None
            return _NUMBER, -number if negative else number
        if isinstance(value, str) and not negative:
            if len(value) > MAX_ID_CHARS:
                raise RulesError(
                    f"a text of {len(value):,} characters is longer than any field can be "
                    f"({MAX_ID_CHARS} at most)"
                )
            return _TEXT, value
        raise self._refuse(node, "is not a constant: write a number, 'text', True or False")

    def _arithmetic(self, node: ast.BinOp, depth: int) -> _Eval:
        op = type(node.op)
        if op is not ast.Div and op not in _ARITHMETIC:
            raise self._refuse(node, "is not allowed: between numbers only + - * /")
        why = "+ - * / need numbers"
        left = self._expect(node.left, depth, _NUMBER, why)
        right = self._expect(node.right, depth, _NUMBER, why)
        if op is ast.Div:
            return lambda batch: _divide(left(batch), right(batch))
        apply = _ARITHMETIC[op]
        return lambda batch: apply(left(batch), right(batch))

    def _comparison(self, node: ast.Compare, depth: int) -> _Eval:
        operands: list[_Eval] = []
        tests: list[Callable[[Any, Any], Any]] = []
        left_node = node.left
        left_kind, left = self._compile(left_node, depth)
        operands.append(left)
        for position, (op, right_node) in enumerate(zip(node.ops, node.comparators, strict=True)):
            if isinstance(op, ast.In | ast.NotIn):
                if position < len(node.ops) - 1:
                    raise self._refuse(node, "compares a list: `in [...]` must end a comparison")
                members = self._members(right_node, left_node, left_kind)
                operands.append(_constant(members))
                if isinstance(op, ast.In):
                    tests.append(_is_in)
                else:
                    tests.append(_number_not_in if left_kind == _NUMBER else _is_not_in)
                continue
            right_kind, right = self._compile(right_node, depth)
            if type(op) in _ORDERING:
                if left_kind != _NUMBER or right_kind != _NUMBER:
                    text = left_node if left_kind != _NUMBER else right_node
                    raise self._refuse(
                        node,
                        f"orders `{self._segment(text)}`, which is "
                        f"{left_kind if text is left_node else right_kind}: "
                        "< <= > >= need numbers (compare text with == != in)",
                    )
                tests.append(_ORDERING[type(op)])
            elif isinstance(op, ast.Eq | ast.NotEq):
                if left_kind != right_kind:
                    raise self._refuse(
                        node,
                        f"compares `{self._segment(left_node)}` ({left_kind}) with "
                        f"`{self._segment(right_node)}` ({right_kind})",
                    )
                if left_kind == _TEXT:
                    _check_width(left_node, right_node)
                    _check_width(right_node, left_node)
                if isinstance(op, ast.Eq):
                    tests.append(operator.eq)
                else:
                    tests.append(_not_equal if left_kind == _NUMBER else operator.ne)
            else:
                raise self._refuse(
                    node, "is not allowed: compare with < <= > >= == != in or not in"
                )
            operands.append(right)
            left_node, left_kind = right_node, right_kind
        if len(tests) == 1:
            first, second, test = operands[0], operands[1], tests[0]
            return lambda batch: test(first(batch), second(batch))

        def chain(batch: _Batch) -> Any:
            values = [operand(batch) for operand in operands]
            return functools.reduce(
                np.logical_and, [test(values[i], values[i + 1]) for i, test in enumerate(tests)]
            )

        return chain

    def _members(self, node: ast.expr, left: ast.expr, kind: str) -> _Members:
        """The members after `in`: text as a set (a fixed-width text array would hold every
        member at the longest one's width), numbers and flags as an array."""
        if not isinstance(node, ast.List | ast.Tuple):
            raise self._refuse(node, "must be a list of constants after `in`, e.g. [1, 2]")
        if len(node.elts) > MAX_MEMBERS:
            raise RulesError(
                f"`{self._segment(left)} in [...]` lists {len(node.elts):,} members: no more "
                f"than {MAX_MEMBERS:,} members in a list"
            )
        values: list[Any] = []
        for element in node.elts:
            element_kind, value = self._literal(element)
            if element_kind != kind:
                raise self._refuse(
                    element, f"is {element_kind}, but `{self._segment(left)}` is {kind}"
                )
            if kind == _TEXT:
                _check_width(left, element)
            values.append(value)
        if kind == _TEXT:
            return frozenset(values)
        return np.unique(np.array(values, dtype=np.float64 if kind == _NUMBER else np.bool_))


def _check_width(field: ast.expr, text: ast.expr) -> None:
    """Refuse a text constant longer than the text field it is compared with can be."""
    if not (isinstance(field, ast.Name) and isinstance(text, ast.Constant)):
        return
    width = _TEXT_WIDTH.get(field.id)
    if width is not None and isinstance(text.value, str) and len(text.value) > width:
        shown = text.value if len(text.value) <= 12 else f"{text.value[:12]}…"
        raise RulesError(
            f"{shown!r} is longer than `{field.id}` can be ({width} characters): it never matches"
        )


# --- entries ------------------------------------------------------------------------------------


class _Override(NamedTuple):
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
            match &= _is_in(columns.mcc, self.mcc_codes)
        if self.country is not None:
            match &= columns.country == self.country
        return match


class _Rule(NamedTuple):
    name: str
    level: int
    test: _Eval


@dataclass(frozen=True, slots=True)
class _Ids:
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

    def changed(self, entry: str, present: bool) -> _Ids:
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
            return _Ids((self.base - removed) | added)
        return _Ids(self.base, added, removed)

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


class _FileSpec(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    deny: _ListsSpec = msgspec.field(default_factory=_ListsSpec)
    allow: _ListsSpec = msgspec.field(default_factory=_ListsSpec)
    override: tuple[_NamedOverrideSpec, ...] = ()
    rule: tuple[_NamedRuleSpec, ...] = ()


def _override(name: str, spec: _OverrideSpec) -> _Override:
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
    return _Override(name, Thresholds(spec.review, spec.decline), spec.channel, codes, spec.country)


def _rule(name: str, spec: _RuleSpec) -> _Rule:
    level = _LEVEL_OF_THEN.get(spec.then)
    if level is None:
        raise RulesError(
            f"rule {name!r}: then must be review or decline, got {spec.then!r} "
            "(a rule only escalates; approve through [allow])"
        )
    try:
        test = _Compiler(spec.when.strip()).condition()
    except RulesError as exc:
        raise RulesError(f"rule {name!r}: {exc}") from None
    return _Rule(name, level, test)


class _Entries(NamedTuple):
    """The entries of one source, the file or the topic; overrides and rules in their order."""

    lists: Mapping[tuple[str, str], _Ids]
    overrides: Mapping[str, _Override]
    rules: Mapping[str, _Rule]


_NO_ENTRIES = _Entries({key: _Ids() for key in _LISTS}, {}, {})


def _file_entries(spec: _FileSpec) -> _Entries:
    lists: dict[tuple[str, str], _Ids] = {}
    for action, table in (("deny", spec.deny), ("allow", spec.allow)):
        kinds = zip(_LIST_KINDS, (table.cards, table.merchants, table.terminals), strict=True)
        for kind, ids in kinds:
            if "" in ids:
                raise RulesError(f"[{action}] {kind}s: an id is empty")
            longest = max(ids, key=len, default="")
            if len(longest) > MAX_ID_CHARS:
                raise RulesError(f"[{action}] {kind}s: {_too_long_id(longest)}")
            lists[(action, kind)] = _Ids(frozenset(ids))
    for named, count in (("override", len(spec.override)), ("rule", len(spec.rule))):
        if count > MAX_NAMED_ENTRIES:
            raise RulesError(
                f"[[{named}]]: {count:,} of them, more than the "
                f"{MAX_NAMED_ENTRIES} {named}s a rule set may hold"
            )
    overrides: dict[str, _Override] = {}
    for override in spec.override:
        _check_new_name("override", override.name, overrides)
        overrides[override.name] = _override(override.name, override)
    rules: dict[str, _Rule] = {}
    for rule in spec.rule:
        _check_new_name("rule", rule.name, rules)
        rules[rule.name] = _rule(rule.name, rule)
    return _Entries(lists, overrides, rules)


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


class _ListChange(NamedTuple):
    key: tuple[str, str]
    entry_id: str
    present: bool


class _OverrideChange(NamedTuple):
    name: str
    override: _Override | None


class _RuleChange(NamedTuple):
    name: str
    rule: _Rule | None


_Change = _ListChange | _OverrideChange | _RuleChange
_Spec = TypeVar("_Spec")
_Entry = TypeVar("_Entry")


def _decode(value: bytes, spec: type[_Spec]) -> _Spec:
    try:
        return msgspec.json.decode(value, type=spec)
    except msgspec.DecodeError as exc:
        raise RulesError(f"bad value: {exc}") from None


def _change(key: str, value: bytes | None) -> _Change:
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
        if list_kind not in _LIST_KINDS or not colon:
            raise RulesError(
                f"{kind} keys are {kind}:card:<id>, {kind}:merchant:<id> or {kind}:terminal:<id>"
            )
        if not entry_id:
            raise RulesError("the id is empty")
        if len(entry_id) > MAX_ID_CHARS:
            raise RulesError(_too_long_id(entry_id))
        if value is not None:  # free-form (a reason, who listed it): checked, not read
            _decode(value, dict[str, Any])
        return _ListChange((kind, list_kind), entry_id, value is not None)
    if kind in ("override", "rule") and not rest:
        raise RulesError(f"the {kind} name is empty")
    if len(rest) > MAX_NAME_CHARS:
        raise RulesError(_too_long_name(rest))
    if kind == "override":
        override = None if value is None else _override(rest, _decode(value, _OverrideSpec))
        return _OverrideChange(rest, override)
    if kind == "rule":
        rule = None if value is None else _rule(rest, _decode(value, _RuleSpec))
        return _RuleChange(rest, rule)
    raise RulesError("keys start with deny:, allow:, override: or rule:")


def _put(table: Mapping[str, _Entry], name: str, entry: _Entry | None) -> dict[str, _Entry]:
    """A copy of `table` with `entry` under `name` (in place of an entry of that name), or
    without `name` where `entry` is None."""
    copy = dict(table)
    if entry is None:
        copy.pop(name, None)
    else:
        copy[name] = entry
    return copy


class Rules:
    """The rule set in force (deny and allow lists, segment overrides, expression rules) and how
    it turns a batch's scores into decisions. Immutable: `with_update` returns a new value."""

    EMPTY: ClassVar[Rules]
    __slots__ = ("_file", "_lists", "_overrides", "_rules", "_topic")

    def __init__(
        self, file: _Entries, topic: _Entries, lists: Mapping[tuple[str, str], _Ids]
    ) -> None:
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
                document = _yaml_document(path, text)
            else:
                document = tomllib.loads(text.decode("utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigurationError(f"rules file {path}: not valid TOML: {exc}") from exc
        except RecursionError:
            raise ConfigurationError(f"rules file {path}: nested too deep") from None
        try:
            return cls.parse(document, f"rules file {path}")
        except RulesError as exc:
            raise ConfigurationError(str(exc)) from exc

    @classmethod
    def parse(cls, document: Mapping[str, Any], source: str) -> Rules:
        """The rules of a parsed TOML document; RulesError naming `source` and the problem."""
        try:
            file = _file_entries(msgspec.convert(document, _FileSpec))
        except (msgspec.ValidationError, RulesError) as exc:
            raise RulesError(f"{source}: {exc}") from None
        return cls(file, _NO_ENTRIES, file.lists)

    def with_update(self, key: str, value: bytes | None) -> Rules:
        """These rules with one rules-topic record applied (value None: a tombstone).

        RulesError with a one-line reason for a record that cannot be applied; this value is
        unchanged either way.
        """
        try:
            change = _change(key, value)
        except RulesError as exc:
            raise RulesError(f"rules topic key {key!r}: {exc}") from None
        topic = self._topic
        if isinstance(change, _OverrideChange):
            self._check_room(key, "override", change.name, change.override, self._file.overrides)
            topic = topic._replace(overrides=_put(topic.overrides, change.name, change.override))
            return Rules(self._file, topic, self._lists)
        if isinstance(change, _RuleChange):
            self._check_room(key, "rule", change.name, change.rule, self._file.rules)
            topic = topic._replace(rules=_put(topic.rules, change.name, change.rule))
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
            sum(len(self._lists[(action, kind)]) for kind in _LIST_KINDS)
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
            batch = _Batch(columns, features)
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


Rules.EMPTY = Rules(_NO_ENTRIES, _NO_ENTRIES, _NO_ENTRIES.lists)


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
