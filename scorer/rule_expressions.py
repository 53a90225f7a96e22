"""The rules' expression language: a rule's `when`, compiled once into numpy operations over a
batch (docs/rules.md).

An expression is parsed with `ast`, checked against a whitelist of nodes and typed (number,
text, true/false) before anything runs, then compiled into closures of numpy operations over the
whole batch; user text is never evaluated. Every number is float64, so no literal can overflow
an integer column. A comparison with NaN does not match (`!=` included), and a division by zero
yields NaN, so a comparison reading it does not match either. Bounded: an expression's depth and
nodes, the members of an `in [...]` list, and every text it compares (at most what its field
can hold: an id is at most the transaction contract's MAX_ID_CHARS, `country` 2 characters).
Text members are held as a set.
"""

from __future__ import annotations

import ast
import difflib
import functools
import operator
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from contracts.transaction import MAX_ID_CHARS
from scorer.card_history import MS_PER_DAY, MS_PER_HOUR
from scorer.catalogue import BY_NAME, LOG1P_FEATURES
from scorer.columns import TransactionColumns

#: An expression may nest this deep. The compiled closures recurse once per level on every
#: batch; the bound keeps any accepted rule far from Python's recursion limit.
MAX_EXPRESSION_DEPTH = 64
#: Members of one `in [...]` list.
MAX_MEMBERS = 1_000
#: Nodes of one expression, not counting its lists' members: each is an array operation on
#: every batch.
MAX_EXPRESSION_NODES = 256
#: The longest value each text field can hold (contracts/transaction.py): a longer text can
#: never match it. Any other text is at most an id's length.
_TEXT_WIDTH = {"country": 2, "currency": 3, "channel": 4}


class RulesError(ValueError):
    """A rules file or rules-topic record that cannot be used; the message says why in one line."""


_NUMBER, _TEXT, _FLAG = "a number", "text", "true/false"
#: A compiled (sub)expression: the batch → an array over its rows, or a scalar (a constant).
_Eval = Callable[["Batch"], Any]
#: A compiled `when`: the batch → which rows it holds for (or one flag, for constants only).
Condition = _Eval
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
_ARITHMETIC = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


class Batch:
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


def is_in(a: Any, members: _Members) -> Any:
    """Which values of `a` (an array, or a constant) are among `members`."""
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
    return np.logical_not(is_in(a, members))


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
                    tests.append(is_in)
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

        def chain(batch: Batch) -> Any:
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


def compile_condition(text: str) -> Condition:
    """A rule's `when` as a condition over a batch; RulesError saying what is wrong with it."""
    return _Compiler(text).condition()
