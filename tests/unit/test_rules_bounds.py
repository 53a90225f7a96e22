"""The bounds of a rule set (issue 43, finding 3): a rules-topic record or a rules file may
cost only so much to read and to apply, whatever it holds. A 34 KB record (`country in [...]`
with 2,000 members, one of them 20,000 characters long) once cost 161 MB to apply and 645 MB
to decide each batch of 500 rows with, and was accepted."""

from __future__ import annotations

import itertools
import json
import string
from pathlib import Path

import numpy as np
import pytest

from contracts.transaction import MAX_ID_CHARS
from plumbing.errors import ConfigurationError
from scorer import rule_sources
from scorer.decisions import Thresholds
from scorer.rule_expressions import MAX_EXPRESSION_NODES, MAX_MEMBERS
from scorer.rule_sources import MAX_NAMED_ENTRIES, MAX_RULES_FILE_BYTES, MAX_UPDATE_BYTES
from scorer.rules import Rules, RulesError
from tests.support.budget import MIB, Budget, within
from tests.unit.test_rules import columns, features

DEFAULTS = Thresholds(review=0.5, decline=0.8)
#: Refusing a record costs about what reading its bytes does: far under a megabyte.
REFUSAL = Budget(peak_bytes=5 * MIB, seconds=1.0)
_CODES = ["".join(p) for p in itertools.product(string.ascii_uppercase, repeat=3)]


def amplification_record() -> bytes:
    """The review's record: 2,000 members after `country in`, one 20,000 characters long."""
    members = [repr(code) for code in _CODES[:1_999]] + [repr("Z" * 20_000)]
    when = f"country in [{', '.join(members)}]"
    return json.dumps({"when": when, "then": "decline"}).encode()


def rule_value(when: str, then: str = "decline") -> bytes:
    return json.dumps({"when": when, "then": then}).encode()


def test_the_amplification_record_is_refused_within_a_small_budget() -> None:
    value = amplification_record()
    with within(REFUSAL, "the amplification record"), pytest.raises(RulesError) as caught:
        Rules.EMPTY.with_update("rule:amp", value)
    assert "\n" not in str(caught.value)


def test_an_update_over_the_size_bound_is_refused_before_it_is_parsed() -> None:
    # Not even JSON: only its size is read.
    value = b"{" * (MAX_UPDATE_BYTES + 1)
    with within(REFUSAL, "an oversized update"), pytest.raises(RulesError, match="bytes"):
        Rules.EMPTY.with_update("rule:big", value)
    with pytest.raises(RulesError, match="key"):
        Rules.EMPTY.with_update("deny:card:" + "c" * 10_000, b"{}")


@pytest.mark.parametrize(
    ("when", "problem"),
    [
        ("country in ['NG', 'NGA']", "longer than `country` can be (2 characters)"),
        ("currency == 'EURO'", "longer than `currency` can be (3 characters)"),
        ("channel not in ['ecommerce']", "longer than `channel` can be (4 characters)"),
        (f"'{'x' * (MAX_ID_CHARS + 1)}' == country", "longer than"),
        (
            f"mcc in [{', '.join(str(i) for i in range(MAX_MEMBERS + 1))}]",
            f"more than {MAX_MEMBERS:,} members",
        ),
        (" or ".join(["amount > 1"] * MAX_EXPRESSION_NODES), "more than"),
    ],
)
def test_members_and_text_beyond_what_a_field_can_hold_are_refused(when: str, problem: str) -> None:
    with pytest.raises(RulesError) as caught:
        Rules.EMPTY.with_update("rule:r", rule_value(when))
    assert problem in str(caught.value)


def test_many_text_members_are_held_as_a_set_and_match_as_before() -> None:
    # Over 16 members, `in` used np.isin over a fixed-width text array; a set is as exact.
    codes = _CODES[: MAX_MEMBERS - 1]
    current = Rules.EMPTY.with_update(
        "rule:r", rule_value(f"currency in {[*codes, 'USD']!r} and country not in ['NG']")
    )
    cols = columns(3, currency=["USD", "EUR", "AAB"], country=["US", "US", "NG"])
    outcome = current.decide(cols, features(cols), np.zeros(3, np.float32), DEFAULTS)
    assert outcome.decisions == ["decline", "approve", "approve"]
    constant = Rules.EMPTY.with_update("rule:r", rule_value(f"'USD' in {[*codes, 'USD']!r}"))
    assert (
        constant.decide(cols, features(cols), np.zeros(3, np.float32), DEFAULTS).decisions
        == ["decline"] * 3
    )


def test_rules_and_overrides_are_bounded_in_number() -> None:
    current = Rules.EMPTY
    for i in range(MAX_NAMED_ENTRIES):
        current = current.with_update(f"rule:r{i}", rule_value("amount > 1"))
    with pytest.raises(RulesError, match=f"{MAX_NAMED_ENTRIES} rules"):
        current.with_update("rule:one-more", rule_value("amount > 1"))
    # Replacing one, or removing one, is still fine.
    current.with_update("rule:r0", rule_value("amount > 2")).with_update("rule:r1", None)


def test_an_id_longer_than_the_contract_allows_is_refused() -> None:
    with pytest.raises(RulesError, match=f"{MAX_ID_CHARS} characters"):
        Rules.EMPTY.with_update(f"deny:card:{'c' * (MAX_ID_CHARS + 1)}", b"{}")
    with pytest.raises(RulesError, match=f"{MAX_ID_CHARS} characters"):
        Rules.parse({"deny": {"cards": ["c" * (MAX_ID_CHARS + 1)]}}, "test")


def test_a_rules_file_over_its_size_bound_stops_the_start_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    with path.open("wb") as file:
        file.truncate(MAX_RULES_FILE_BYTES + 1)
    with within(REFUSAL, "an oversized rules file"), pytest.raises(ConfigurationError) as caught:
        Rules.load(path)
    assert str(path) in str(caught.value) and "bytes" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_rules_file_with_too_many_rules_or_members_stops_the_start(tmp_path: Path) -> None:
    many = tmp_path / "many.toml"
    many.write_text(
        "".join(
            f"[[rule]]\nname = 'r{i}'\nwhen = 'amount > 1'\nthen = 'review'\n"
            for i in range(MAX_NAMED_ENTRIES + 1)
        )
    )
    with pytest.raises(ConfigurationError, match=f"{MAX_NAMED_ENTRIES} rules"):
        Rules.load(many)
    wide = tmp_path / "wide.toml"
    wide.write_text(
        "[[rule]]\nname = 'r'\nthen = 'review'\nwhen = "
        + json.dumps(json.loads(amplification_record())["when"])
        + "\n"
    )
    refused = pytest.raises(ConfigurationError, match=str(wide))
    with within(REFUSAL, "the amplification rule in a file"), refused:
        Rules.load(wide)


def test_a_yaml_alias_bomb_is_refused(tmp_path: Path) -> None:
    # Aliases share one object, and the lists must hold text: refused on the first nested list.
    pytest.importorskip("yaml")
    lines = ["a0: &a0 [c-1, c-2, c-3, c-4, c-5, c-6, c-7, c-8, c-9]"]
    for i in range(1, 12):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]")
    lines.append("deny: {cards: *a11}")
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    with within(Budget(20 * MIB, 5.0), "a YAML alias bomb"), pytest.raises(ConfigurationError):
        Rules.load(path)


def test_the_bounds_are_what_the_docs_say() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "rules.md").read_text()
    for bound in (MAX_UPDATE_BYTES, MAX_MEMBERS, MAX_NAMED_ENTRIES, MAX_EXPRESSION_NODES):
        assert f"{bound:,}" in text, bound
    assert f"{MAX_RULES_FILE_BYTES // MIB} MiB" in text
    assert rule_sources.MAX_KEY_CHARS
