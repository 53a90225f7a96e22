"""The budget of a transaction and a label in the JSON formats, which need no registry (issue 43;
docs/threat-model.md): whatever the bytes, a record is decoded or refused with the contract's
error, within a stated memory and time budget. The registry formats' budgets run against a real
registry (tests/integration/test_registry_budgets.py).

Hostile inputs: deep nesting, huge arrays and objects, long strings, numbers past every type,
invalid UTF-8, and records cut anywhere, each up to the length bound a mapped record has."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from contracts.field_mapping import FieldMapping
from contracts.input_formats import DEFAULT_MAX_RECORD_BYTES, transaction_decoder
from contracts.label import Label, decode_label
from contracts.transaction import Transaction, decode_transaction
from plumbing.errors import RecordError
from simulator.team_shapes import checkout_event
from simulator.transactions import TransactionSimulator
from tests.support.budget import MIB, Budget, within

#: A JSON record of at most the length bound: the typed decoders build only the contract's
#: fields; the mapped decoder builds the whole document: 1.5 MiB for 64 KiB of `{},` (a 1 MB
#: record, as the broker takes, built 23 MiB before the bound).
BUDGET = Budget(peak_bytes=8 * MIB, seconds=5.0)
MAPPING = FieldMapping.load(Path(__file__).parents[2] / "examples" / "checkout" / "mapping.toml")
VALID = [dict(r) for r in TransactionSimulator(5, id_prefix="budget").generate(5).records]

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(),
    st.text(max_size=64),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=8) | st.dictionaries(st.text(max_size=12), inner),
    max_leaves=40,
)


def _blown_up(kind: str, size: int) -> bytes:
    """A record of about `size` bytes that builds as many objects as it can."""
    unit = {"lists": b"[],", "objects": b"{},", "numbers": b"0,", "strings": b'"",'}[kind]
    return b'{"junk":[' + unit * (size // len(unit)) + b"0]}"


HOSTILE = st.one_of(
    st.binary(max_size=512),
    json_values.map(lambda v: json.dumps(v, allow_nan=True).encode()),
    st.builds(
        lambda r, extra: json.dumps({**r, **extra}).encode(),
        st.sampled_from(VALID),
        st.dictionaries(st.text(max_size=12), json_values, max_size=6),
    ),
    st.builds(
        lambda depth: b"[" * depth + b"]" * depth, st.integers(min_value=1, max_value=200_000)
    ),
    st.builds(
        _blown_up,
        st.sampled_from(["lists", "objects", "numbers", "strings"]),
        st.integers(min_value=1, max_value=DEFAULT_MAX_RECORD_BYTES + 4_096),
    ),
    st.builds(
        lambda r, cut: json.dumps(r).encode()[:cut], st.sampled_from(VALID), st.integers(0, 400)
    ),
)

mapped_decode = transaction_decoder("json", "transactions", mapping=MAPPING)


def _outcome(decode: Any, value: bytes, kind: type) -> str:
    """Decode within the budget: the type's name, or the refusal's reason."""
    with within(BUDGET, f"a record of {len(value):,} bytes"):
        try:
            result = decode(value)
        except RecordError as refused:
            return refused.reason
    assert isinstance(result, kind)
    return "decoded"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(HOSTILE)
@example(_blown_up("lists", DEFAULT_MAX_RECORD_BYTES - 20))
@example(b"[" * 100_000)
def test_a_transaction_in_the_contracts_json_is_decided_or_refused_within_budget(
    value: bytes,
) -> None:
    _outcome(decode_transaction, value, Transaction)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(
        HOSTILE,
        st.builds(
            lambda r, extra: json.dumps({**checkout_event(r), **extra}).encode(),
            st.sampled_from(VALID),
            st.dictionaries(st.text(max_size=12), json_values, max_size=6),
        ),
    )
)
@example(_blown_up("objects", DEFAULT_MAX_RECORD_BYTES - 20))
@example(_blown_up("objects", 1_000_000))  # what the broker takes, past the bound
def test_a_mapped_transaction_is_decided_or_refused_within_budget(value: bytes) -> None:
    outcome = _outcome(mapped_decode, value, Transaction)
    if len(value) > DEFAULT_MAX_RECORD_BYTES:
        assert outcome == "decode", "past the bound: refused undecoded"


def test_a_mapped_checkout_event_is_decoded() -> None:
    event = checkout_event(VALID[0])
    assert mapped_decode(msgspec.json.encode(event)).transaction_id == VALID[0]["transaction_id"]


@settings(max_examples=100, deadline=None)
@given(HOSTILE)
@example(b'{"transaction_id": "' + b"x" * 900_000 + b'"}')
def test_a_label_is_used_or_refused_within_budget(value: bytes) -> None:
    _outcome(decode_label, value, Label)
