"""`tests.support.budget`: the check every input surface's property test relies on."""

from __future__ import annotations

import pytest

from tests.support.budget import MIB, Budget, within


def test_a_block_within_budget_reports_what_it_spent() -> None:
    with within(Budget(MIB, 5.0)) as spent:
        kept = [0] * 10_000
    assert len(kept) == 10_000
    assert 80_000 <= spent.peak_bytes <= MIB


def test_a_block_over_its_memory_budget_fails() -> None:
    with pytest.raises(AssertionError, match="over its budget"), within(Budget(MIB, 5.0)):
        bytearray(2 * MIB)


def test_a_refusal_over_budget_fails_too() -> None:
    with pytest.raises(AssertionError, match="over its budget"), within(Budget(MIB, 5.0)):
        kept = bytearray(2 * MIB)
        raise ValueError(len(kept))


def test_a_refusal_within_budget_passes_through() -> None:
    with pytest.raises(KeyError), within(Budget(MIB, 5.0)):
        raise KeyError("refused")


def test_a_budget_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        Budget(0, 1.0)
