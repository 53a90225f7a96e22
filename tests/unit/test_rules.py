"""Rules that overrule the model: precedence, segment thresholds, expressions, refusals, updates."""

from __future__ import annotations

import json
import re
import sys
import textwrap
import tomllib
from pathlib import Path
from typing import Any
from unittest.mock import patch

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from plumbing.errors import ConfigurationError
from scorer.catalogue import LOG1P_FEATURES
from scorer.columns import TransactionColumns
from scorer.decisions import Thresholds, classify
from scorer.features import FEATURE_NAMES, NUM_FEATURES, build_features
from scorer.rules import Rules, RulesError

DEFAULTS = Thresholds(review=0.5, decline=0.8)
HOUR_MS = 3_600_000
NOON = 12 * HOUR_MS


def columns(n: int, **fields: Any) -> TransactionColumns:
    """n ordinary transactions (a grocery purchase at noon, card present), `fields` replaced."""
    values: dict[str, Any] = {
        "amount": np.full(n, 100.0),
        "currency": np.full(n, "USD", "<U3"),
        "mcc": np.full(n, 5411, np.int64),
        "country": np.full(n, "US", "<U2"),
        "channel": np.full(n, "pos", "<U4"),
        "card_present": np.ones(n, np.bool_),
        "event_time": np.full(n, NOON, np.int64),
        "card_id": [f"c-{i}" for i in range(n)],
        "merchant_id": ["m-0"] * n,
        "terminal_id": ["t-0"] * n,
    }
    for name, value in fields.items():
        ids = name.endswith("_id")
        values[name] = value if ids else np.asarray(value, values[name].dtype)
    return TransactionColumns(**values)


def features(cols: TransactionColumns, **natural: Any) -> npt.NDArray[np.float32]:
    """The batch's features with `natural` set, in natural units (stored as log1p where the
    catalogue says so)."""
    out = build_features(cols)
    for name, value in natural.items():
        value = np.asarray(value, np.float64)
        stored = np.log1p(value) if name in LOG1P_FEATURES else value
        out[:, FEATURE_NAMES.index(name)] = stored.astype(np.float32)
    return out


def rules(document: str) -> Rules:
    return Rules.parse(tomllib.loads(textwrap.dedent(document)), "test rules")


def scores(*values: float) -> npt.NDArray[np.float32]:
    return np.array(values, np.float32)


def matches(when: str, cols: TransactionColumns, feats: npt.NDArray[np.float32]) -> list[bool]:
    """Which rows a review rule `when` hits (every score is low, so review means a hit)."""
    outcome = rules(f"[[rule]]\nname = 'r'\nwhen = {json.dumps(when)}\nthen = 'review'").decide(
        cols, feats, np.zeros(len(cols.amount), np.float32), DEFAULTS
    )
    return [label == "review" for label in outcome.decisions]


# --- precedence ---------------------------------------------------------------------------------


def test_deny_beats_allow_beats_the_model_and_the_rules() -> None:
    r = rules("""
        [deny]
        cards = ["c-0"]
        [allow]
        cards = ["c-0", "c-1"]
        [[rule]]
        name = "big"
        when = "amount > 5000"
        then = "decline"
    """)
    cols = columns(3, amount=[9000.0, 9000.0, 9000.0])
    outcome = r.decide(cols, features(cols), scores(0.0, 0.99, 0.1), DEFAULTS)
    assert outcome.decisions == ["decline", "approve", "decline"]
    assert outcome.hits == [
        ("deny:card", "allow:card", "rule:big"),
        ("allow:card", "rule:big"),
        ("rule:big",),
    ]
    assert outcome.counts == {"deny:card": 1, "allow:card": 2, "rule:big": 3}


def test_merchants_and_terminals_are_listed_and_a_missing_terminal_matches_none() -> None:
    r = rules("""
        [deny]
        merchants = ["m-bad"]
        terminals = ["t-bad"]
    """)
    cols = columns(3, merchant_id=["m-bad", "m-0", "m-0"], terminal_id=["t-0", "t-bad", None])
    outcome = r.decide(cols, features(cols), scores(0.1, 0.1, 0.1), DEFAULTS)
    assert outcome.decisions == ["decline", "decline", "approve"]
    assert outcome.hits == [("deny:merchant",), ("deny:terminal",), ()]


def test_rules_only_escalate_and_the_most_severe_one_counts() -> None:
    r = rules("""
        [[rule]]
        name = "review-all"
        when = "amount > 0"
        then = "review"
        [[rule]]
        name = "decline-atm"
        when = "channel == 'atm'"
        then = "decline"
    """)
    cols = columns(3, channel=["pos", "pos", "atm"])
    outcome = r.decide(cols, features(cols), scores(0.1, 0.95, 0.1), DEFAULTS)
    assert outcome.decisions == ["review", "decline", "decline"]
    assert outcome.hits[2] == ("rule:review-all", "rule:decline-atm")


def test_a_rule_may_not_approve() -> None:
    with pytest.raises(RulesError, match=r"rule 'free': then must be review or decline"):
        rules("[[rule]]\nname = 'free'\nwhen = 'amount < 1'\nthen = 'approve'")


# --- segment overrides --------------------------------------------------------------------------

OVERRIDES = """
    [[override]]
    name = "digital-ecom"
    channel = "ecom"
    mcc_family = "digital"
    review = 0.3
    decline = 0.6
    [[override]]
    name = "ecom"
    channel = "ecom"
    review = 0.1
    decline = 0.2
    [[override]]
    name = "nigeria"
    country = "NG"
    review = 0.9
    decline = 0.95
"""


def test_an_override_changes_the_label_only_in_its_segment() -> None:
    cols = columns(3, channel=["ecom", "pos", "pos"], mcc=[5816, 5816, 5411])
    outcome = rules(OVERRIDES).decide(cols, features(cols), scores(0.4, 0.4, 0.7), DEFAULTS)
    assert outcome.decisions == ["review", "approve", "review"]
    assert outcome.hits == [("override:digital-ecom",), (), ()]


def test_the_first_matching_override_wins() -> None:
    # Row 0 matches digital-ecom and ecom, row 1 only ecom; row 2 only nigeria.
    cols = columns(
        3, channel=["ecom", "ecom", "pos"], mcc=[5816, 5411, 5411], country=["US", "US", "NG"]
    )
    outcome = rules(OVERRIDES).decide(cols, features(cols), scores(0.25, 0.25, 0.85), DEFAULTS)
    assert outcome.decisions == ["approve", "decline", "approve"]
    assert outcome.hits == [("override:digital-ecom",), ("override:ecom",), ("override:nigeria",)]
    assert outcome.counts == {"override:digital-ecom": 1, "override:ecom": 1, "override:nigeria": 1}


def test_rows_without_an_override_are_cut_exactly_as_classify() -> None:
    # 0.7 is not a float32: a threshold compared in float64 would cut float32(0.7) differently.
    edge = np.float32(0.7)
    cols = columns(2, channel=["ecom", "pos"])
    thresholds = Thresholds(0.7, 0.9)
    model_scores = np.array([0.0, edge], np.float32)
    outcome = rules(OVERRIDES).decide(cols, features(cols), model_scores, thresholds)
    assert outcome.decisions[1] == classify(np.array([edge]), thresholds)[0] == "review"


# --- expressions --------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [1, 3, 6, 12, 16, 37, 1000, 123_457])
def test_log1p_features_read_in_natural_units(count: int) -> None:
    cols = columns(1)
    feats = features(cols, card_tx_1h=count, card_avg_amount_30d=count)
    assert matches(f"card_tx_1h >= {count}", cols, feats) == [True]
    assert matches(f"card_tx_1h == {count} == card_avg_amount_30d", cols, feats) == [True]
    assert matches(f"card_tx_1h > {count}", cols, feats) == [False]
    assert matches(f"card_tx_1h < {count}", cols, feats) == [False]


def test_features_not_stored_as_log1p_are_read_as_they_are() -> None:
    cols = columns(2)
    feats = features(cols, card_amount_zscore=[4.0, 2.0], terminal_risk_7d=[0.5, 0.0])
    assert matches("card_amount_zscore > 3 or terminal_risk_7d >= 0.5", cols, feats) == [
        True,
        False,
    ]


def test_hour_is_the_utc_hour_of_the_event_time() -> None:
    day = 86_400_000
    cols = columns(4, event_time=[3 * HOUR_MS + 59_999, 20 * day + 23 * HOUR_MS, 0, -HOUR_MS])
    assert matches("hour == 3", cols, features(cols)) == [True, False, False, False]
    assert matches("hour < 1 or hour >= 23", cols, features(cols)) == [False, True, True, True]


def test_in_and_not_in_against_literal_lists() -> None:
    cols = columns(
        3, country=["NG", "US", "RU"], mcc=[5816, 5411, 6011], channel=["ecom", "pos", "atm"]
    )
    feats = features(cols)
    assert matches("country in ['NG', 'RU']", cols, feats) == [True, False, True]
    assert matches("mcc not in (5411, 5412)", cols, feats) == [True, False, True]
    assert matches("channel not in ['pos'] and mcc in [6011, -1]", cols, feats) == [
        False,
        False,
        True,
    ]


def test_chained_comparisons_hold_pairwise() -> None:
    cols = columns(4, amount=[50.0, 100.0, 1000.0, 1000.01])
    assert matches("100 <= amount <= 1000 != 999", cols, features(cols)) == [
        False,
        True,
        True,
        False,
    ]


def test_text_and_true_false_fields() -> None:
    cols = columns(
        3, currency=["EUR", "EUR", "USD"], channel=["ecom", "atm", "ecom"], card_present=[0, 1, 0]
    )
    feats = features(cols)
    assert matches("currency == 'EUR' and channel != 'atm'", cols, feats) == [True, False, False]
    assert matches("not card_present", cols, feats) == [True, False, True]
    assert matches("card_present == false or currency == 'USD'", cols, feats) == [
        True,
        False,
        True,
    ]


def test_arithmetic_and_division_by_zero_does_not_match() -> None:
    cols = columns(3, amount=[2000.0, 2000.0, 0.0])
    feats = features(cols, card_avg_amount_30d=[100.0, 0.0, 0.0])
    assert matches("amount / card_avg_amount_30d > 10", cols, feats) == [True, False, False]
    assert matches("amount / card_avg_amount_30d != 5", cols, feats) == [True, False, False]
    assert matches("-amount * 2 + 1 <= -3999", cols, feats) == [True, True, False]


def test_nan_never_matches_and_infinity_compares_as_a_number() -> None:
    cols = columns(3)
    feats = features(cols, card_amount_zscore=[np.nan, np.inf, -np.inf])
    assert matches("card_amount_zscore > 3", cols, feats) == [False, True, False]
    assert matches("card_amount_zscore != 3", cols, feats) == [False, True, True]
    assert matches("card_amount_zscore not in [3]", cols, feats) == [False, True, True]
    assert matches("card_amount_zscore - card_amount_zscore == 0", cols, feats) == [
        False,
        False,
        False,
    ]


def test_a_rule_of_constants_applies_to_every_row() -> None:
    cols = columns(2)
    assert matches("True", cols, features(cols)) == [True, True]
    assert matches("1 > 2", cols, features(cols)) == [False, False]


# --- refusals -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("when", "piece"),
    [
        ("__import__('os').system('true')", "`__import__('os').system('true')` is not allowed"),
        ("amount.real > 1", "`amount.real` is not allowed (an attribute)"),
        ("card_tx_1h[0] > 1", "(a subscript)"),
        ("(lambda: 1)() > 0", "(a function call)"),
        ("amout > 100", "`amout` is not a name rules know (did you mean `amount`?)"),
        ("country == 5", "compares `country` (text) with `5` (a number)"),
        ("country > 'NG'", "< <= > >= need numbers"),
        ("amount in ['a']", "`'a'` is text, but `amount` is a number"),
        ("amount in card_tx_1h", "must be a list of constants"),
        ("amount ** 2 > 1", "`amount ** 2` is not allowed"),
        ("amount", "is a number, not a condition"),
        ("not amount", "`not` negates a condition"),
        ("amount > 1 if True else False", "(a conditional expression)"),
        ("amount > ", "`when` is not an expression"),
        ("country + 'x' == 'y'", "+ - * / need numbers"),
        ("amount > 1e5 and " + "(" * 70 + "amount" + ")" * 70 + " > 1", ""),
        ("-" * 70 + "amount > 0", "nests deeper than 64 levels"),
    ],
)
def test_expressions_outside_the_language_are_refused_naming_the_rule(
    when: str, piece: str
) -> None:
    document = {"rule": [{"name": "bad", "when": when, "then": "review"}]}
    if not piece:  # redundant parentheses are not nesting: accepted
        Rules.parse(document, "f.toml")
        return
    with pytest.raises(RulesError) as caught:
        Rules.parse(document, "f.toml")
    message = str(caught.value)
    assert message.startswith("f.toml: rule 'bad': ")
    assert piece in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        ("[rules]\nx = 1", "unknown field `rules`"),
        ("[deny]\ncard = ['c']", "unknown field `card`"),
        ("[deny]\ncards = 'c-1'", "Expected `array`, got `str`"),
        ("[deny]\ncards = ['']", "[deny] cards: an id is empty"),
        ("[[override]]\nname = 'o'\nchannel = 'pos'\nreview = 'high'\ndecline = 0.9", "float"),
        (
            "[[override]]\nname = 'o'\nchannel = 'pos'\nreview = 0.5\ndecline = 0.9\nsegment = 1",
            "`segment`",
        ),
        ("[[override]]\nname = 'o'\nreview = 0.5\ndecline = 0.9", "names no segment"),
        ("[[override]]\nname = 'o'\nchannel = 'web'\nreview = 0.5\ndecline = 0.9", "channel must"),
        (
            "[[override]]\nname = 'o'\nmcc_family = 'toys'\nreview = 0.5\ndecline = 0.9",
            "mcc_family",
        ),
        ("[[override]]\nname = 'o'\ncountry = 'ng'\nreview = 0.5\ndecline = 0.9", "country must"),
        (
            "[[override]]\nname = 'o'\ncountry = 'NG'\nreview = 0.9\ndecline = 0.5",
            "review <= decline",
        ),
        (
            "[[override]]\nname = 'o'\ncountry = 'NG'\nreview = nan\ndecline = 0.5",
            "review <= decline",
        ),
        ("[[rule]]\nname = 'r'\nwhen = 'amount > 1'", "missing required field `then`"),
        ("[[rule]]\nname = 'r'\nwhen = 'amount > 1'\nthen = 'block'", "then must be review"),
        ("[[rule]]\nname = 'r'\nwhen = 5\nthen = 'review'", "Expected `str`, got `int`"),
        ("[[rule]]\nname = ''\nwhen = 'True'\nthen = 'review'", "name is empty"),
        ("[[rule]]\nname = 'r'\nwhen = 'True'\nthen = 'review'\n" * 2, "'r' is defined twice"),
    ],
)
def test_a_bad_document_is_refused_in_one_line(document: str, problem: str) -> None:
    with pytest.raises(RulesError) as caught:
        rules(document)
    assert str(caught.value).startswith("test rules: ")
    assert problem in str(caught.value)
    assert "\n" not in str(caught.value)


def test_load_reads_a_file_and_names_it_when_it_cannot(tmp_path: Path) -> None:
    good = tmp_path / "rules.toml"
    good.write_text('[deny]\ncards = ["c-1"]\n[[rule]]\nname = "r"\nwhen = "True"\nthen = "review"')
    assert Rules.load(good).summary() == "1 deny, 0 allow, 0 overrides, 1 rule"
    broken = tmp_path / "broken.toml"
    broken.write_text("[deny\n")
    for path, problem in (
        (broken, "not valid TOML"),
        (tmp_path / "missing.toml", "cannot read it"),
        (_written(tmp_path / "bad.toml", "[allow]\ncards = [1]"), "Expected `str`, got `int`"),
    ):
        with pytest.raises(
            ConfigurationError, match=f"rules file {re.escape(str(path))}: .*{re.escape(problem)}"
        ):
            Rules.load(path)


def test_a_yaml_file_holds_the_same_rules_as_its_toml_twin(tmp_path: Path) -> None:
    toml_rules = Rules.load(
        _written(
            tmp_path / "rules.toml",
            """
            [deny]
            cards = ["c-0"]
            [allow]
            merchants = ["m-1"]
            [[override]]
            name = "ecom"
            channel = "ecom"
            review = 0.2
            decline = 0.3
            [[rule]]
            name = "big"
            when = "amount > 5000"
            then = "decline"
            """.replace("            ", ""),
        )
    )
    yaml_rules = Rules.load(
        _written(
            tmp_path / "rules.yaml",
            """
            deny: {cards: [c-0]}
            allow:
              merchants: [m-1]
            override:
              - {name: ecom, channel: ecom, review: 0.2, decline: 0.3}
            rule:
              - name: big
                when: amount > 5000
                then: decline
            """.replace("            ", ""),
        )
    )
    cols = columns(
        4,
        card_id=["c-0", "c-1", "c-2", "c-3"],
        merchant_id=["m-0", "m-1", "m-0", "m-0"],
        channel=["pos", "pos", "ecom", "pos"],
        amount=[10.0, 9000.0, 10.0, 9000.0],
    )
    score = scores(0.0, 0.99, 0.25, 0.0)
    outcome = yaml_rules.decide(cols, features(cols), score, DEFAULTS)
    assert outcome == toml_rules.decide(cols, features(cols), score, DEFAULTS)
    assert outcome.decisions == ["decline", "approve", "review", "decline"]
    assert yaml_rules.summary() == toml_rules.summary() == "1 deny, 1 allow, 1 override, 1 rule"


def test_a_bad_yaml_file_is_refused_naming_it(tmp_path: Path) -> None:
    for name, text, problem in (
        ("broken.yaml", "deny: [", "not valid YAML"),
        ("list.yml", "- deny", "a YAML rules file is a mapping of tables"),
        # YAML reads an unquoted number as one: an id must be text, as in TOML.
        ("number.yaml", "allow: {cards: [1234]}", "Expected `str`, got `int`"),
    ):
        path = _written(tmp_path / name, text)
        with pytest.raises(ConfigurationError, match=f"rules file .*{name}: .*{problem}"):
            Rules.load(path)
    assert Rules.load(_written(tmp_path / "empty.yaml", "")).summary() == (
        "0 deny, 0 allow, 0 overrides, 0 rules"
    )


def test_a_yaml_file_without_pyyaml_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "yaml", None)  # import yaml fails as if not installed
    path = _written(tmp_path / "rules.yml", "deny: {cards: [c-0]}")
    with pytest.raises(ConfigurationError, match=r"pip install 'fraud-scorer\[yaml\]'"):
        Rules.load(path)


def _written(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# --- live updates -------------------------------------------------------------------------------

FILE = """
    [deny]
    cards = ["c-file"]
    [[override]]
    name = "ecom"
    channel = "ecom"
    review = 0.1
    decline = 0.9
    [[rule]]
    name = "big"
    when = "amount > 5000"
    then = "review"
"""


def test_updates_add_and_remove_list_entries_and_leave_the_old_rules_alone() -> None:
    base = rules(FILE)
    denied = base.with_update("deny:card:c-0", b"{}").with_update("allow:merchant:m-0", b'{"a":1}')
    cols = columns(2)
    outcome = denied.decide(cols, features(cols), scores(0.1, 0.9), DEFAULTS)
    assert outcome.decisions == ["decline", "approve"]
    assert outcome.hits == [("deny:card", "allow:merchant"), ("allow:merchant",)]
    assert base.decide(cols, features(cols), scores(0.1, 0.9), DEFAULTS).decisions == [
        "approve",
        "decline",
    ]
    removed = denied.with_update("deny:card:c-0", None).with_update("allow:merchant:m-0", None)
    assert removed.summary() == base.summary() == "1 deny, 0 allow, 1 override, 1 rule"
    assert denied.summary() == "2 deny, 1 allow, 1 override, 1 rule"


def test_a_tombstone_removes_the_topic_entry_only_so_a_restart_agrees() -> None:
    base = rules(FILE)
    updated = base.with_update("deny:card:c-file", b"{}").with_update("deny:card:c-file", None)
    cols = columns(1, card_id=["c-file"])
    assert updated.decide(cols, features(cols), scores(0.0), DEFAULTS).decisions == ["decline"]


def test_topic_overrides_and_rules_replace_the_files_by_name_and_add_after_them() -> None:
    base = rules(FILE)
    updated = (
        base.with_update("override:ecom", b'{"channel": "ecom", "review": 0.6, "decline": 0.7}')
        .with_update("override:pos", b'{"channel": "pos", "review": 0.01, "decline": 0.02}')
        .with_update("rule:big", b'{"when": "amount > 50", "then": "decline"}')
        .with_update("rule:small", b'{"when": "amount < 1", "then": "review"}')
    )
    cols = columns(3, channel=["ecom", "pos", "ecom"], amount=[100.0, 0.5, 10.0])
    outcome = updated.decide(cols, features(cols), scores(0.0, 0.0, 0.65), DEFAULTS)
    assert outcome.decisions == ["decline", "review", "review"]
    assert outcome.hits == [
        ("override:ecom", "rule:big"),
        ("override:pos", "rule:small"),
        ("override:ecom",),
    ]
    assert updated.summary() == "1 deny, 0 allow, 2 overrides, 2 rules"
    # Tombstones: the file's `ecom` and `big` are back, the topic's additions gone.
    restored = updated
    for key in ("override:ecom", "override:pos", "rule:big", "rule:small"):
        restored = restored.with_update(key, None)
    outcome = restored.decide(cols, features(cols), scores(0.0, 0.0, 0.65), DEFAULTS)
    assert outcome.decisions == ["approve", "approve", "review"]
    assert restored.summary() == base.summary()


@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        ("deny:card:c-1", b"{not json", "JSON is malformed"),
        ("deny:card:c-1", b"[1]", "Expected `object`, got `array`"),
        ("deny:card:c-1", b"\xff", "bad value"),
        ("deny:cards:c-1", b"{}", "deny:card:<id>"),
        ("deny:card:", b"{}", "the id is empty"),
        ("block:card:c-1", b"{}", "keys start with deny:, allow:, override: or rule:"),
        ("override:", b"{}", "the override name is empty"),
        ("override:o", b'{"channel": "pos", "review": 0.5}', "missing required field `decline`"),
        ("override:o", b'{"review": 0.5, "decline": 0.6}', "names no segment"),
        ("rule:r", b'{"when": "open(x)", "then": "review"}', "`open(x)` is not allowed"),
        ("rule:r", b'{"when": "True", "then": "approve"}', "then must be review or decline"),
        ("rule:r", b'{"when": "True", "then": "review", "x": 1}', "unknown field `x`"),
    ],
)
def test_a_bad_update_raises_and_changes_nothing(key: str, value: bytes, problem: str) -> None:
    base = rules(FILE)
    with pytest.raises(RulesError) as caught:
        base.with_update(key, value)
    assert str(caught.value).startswith(f"rules topic key {key!r}: ")
    assert problem in str(caught.value)
    assert "\n" not in str(caught.value)
    assert base.summary() == "1 deny, 0 allow, 1 override, 1 rule"


def test_ids_are_any_unicode_and_may_hold_colons() -> None:
    odd = "c:ü💳\n\u200b"
    updated = Rules.EMPTY.with_update(f"deny:card:{odd}", b"{}")
    cols = columns(2, card_id=[odd, "c:ü💳"])
    assert updated.decide(cols, features(cols), scores(0.0, 0.0), DEFAULTS).decisions == [
        "decline",
        "approve",
    ]


def test_a_long_replay_keeps_every_entry() -> None:
    current = Rules.EMPTY
    for i in range(20_000):
        current = current.with_update(f"deny:card:c-{i}", b"{}")
    middle = current
    for i in range(0, 20_000, 2):
        current = current.with_update(f"deny:card:c-{i}", None)
    assert (len(middle), len(current)) == (20_000, 10_000)
    cols = columns(4, card_id=["c-0", "c-1", "c-19999", "c-20000"])
    outcome = current.decide(cols, features(cols), scores(0, 0, 0, 0), DEFAULTS)
    assert outcome.decisions == ["approve", "decline", "decline", "approve"]


CARDS = [f"c-{i}" for i in range(12)]
LIST_IDS = st.sampled_from(CARDS)


@settings(max_examples=200, deadline=None)
@given(
    file_ids=st.sets(LIST_IDS),
    updates=st.lists(st.tuples(LIST_IDS, st.booleans()), max_size=60),
)
def test_list_updates_layer_over_the_file(
    file_ids: set[str], updates: list[tuple[str, bool]]
) -> None:
    topic_ids: set[str] = set()
    current = Rules.parse({"deny": {"cards": sorted(file_ids)}}, "test")
    # Rebuild the id sets' base on every few changes, so that path is exercised too.
    with patch("scorer.rule_sources._MIN_CHANGES_KEPT", 0):
        for card, present in updates:
            current = current.with_update(f"deny:card:{card}", b"{}" if present else None)
            (topic_ids.add if present else topic_ids.discard)(card)
    in_force = file_ids | topic_ids
    every = sorted(CARDS)
    cols = columns(len(every), card_id=every)
    outcome = current.decide(cols, features(cols), np.zeros(len(every), np.float32), DEFAULTS)
    assert [
        card for card, label in zip(every, outcome.decisions, strict=True) if label == "decline"
    ] == sorted(in_force)
    assert len(current) == len(in_force)


# --- never raises -------------------------------------------------------------------------------

IDS = st.sampled_from(["c-1", "ü", "💳", "", "m:1"]) | st.text(max_size=4)
HOSTILE = """
    [deny]
    cards = ["c-1", "💳"]
    merchants = ["m:1"]
    terminals = ["ü"]
    [allow]
    cards = ["ü"]
    [[override]]
    name = "digital"
    mcc_family = "digital"
    review = 0.0
    decline = 1.0
    [[override]]
    name = "ng-ecom"
    channel = "ecom"
    country = "NG"
    review = 0.2
    decline = 0.3
    [[rule]]
    name = "ratio"
    when = "amount / card_avg_amount_30d > 10 or amount / (card_tx_1h - card_tx_1d) <= -1e300"
    then = "review"
    [[rule]]
    name = "overflow"
    when = "amount * card_since_previous * 1e308 != card_amount_zscore - -terminal_risk_1d"
    then = "decline"
    [[rule]]
    name = "fields"
    when = "hour in [0, 1, 2] and country not in ['NG'] and currency == 'USD' and not card_present"
    then = "review"
    [[rule]]
    name = "chain"
    when = "-card_testing_velocity < 0 <= amount < 1e9 / terminal_tx_30d"
    then = "decline"
"""
HOSTILE_RULES = rules(HOSTILE)


@st.composite
def batches(
    draw: st.DrawFn,
) -> tuple[TransactionColumns, npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    n = draw(st.integers(0, 12))
    cols = TransactionColumns(
        amount=draw(arrays(np.float64, n, elements=st.floats(0.0, 1e9))),
        currency=np.array(
            draw(st.lists(st.sampled_from(["USD", "NGN"]), min_size=n, max_size=n)), "<U3"
        ),
        mcc=draw(arrays(np.int64, n, elements=st.sampled_from([0, 5411, 5816, 6011, 9999]))),
        country=np.array(
            draw(st.lists(st.sampled_from(["US", "NG", "ZZ"]), min_size=n, max_size=n)), "<U2"
        ),
        channel=np.array(
            draw(st.lists(st.sampled_from(["pos", "ecom", "atm"]), min_size=n, max_size=n)), "<U4"
        ),
        card_present=draw(arrays(np.bool_, n)),
        event_time=draw(arrays(np.int64, n, elements=st.integers(-(2**62), 2**62))),
        card_id=draw(st.lists(IDS, min_size=n, max_size=n)),
        merchant_id=draw(st.lists(IDS, min_size=n, max_size=n)),
        terminal_id=draw(st.lists(st.none() | IDS, min_size=n, max_size=n)),
    )
    extreme = st.floats(width=32) | st.sampled_from([np.inf, -np.inf, np.nan, 3.4e38, 0.0])
    feats = draw(arrays(np.float32, (n, NUM_FEATURES), elements=extreme))
    model_scores = draw(arrays(np.float32, n, elements=st.floats(0.0, 1.0, width=32)))
    return cols, feats, model_scores


@settings(max_examples=300, deadline=None)
@given(batches())
def test_decide_never_raises_and_labels_every_row(
    batch: tuple[TransactionColumns, npt.NDArray[np.float32], npt.NDArray[np.float32]],
) -> None:
    cols, feats, model_scores = batch
    n = len(cols.amount)
    outcome = HOSTILE_RULES.decide(cols, feats, model_scores, DEFAULTS)
    assert len(outcome.decisions) == len(outcome.hits) == n
    assert set(outcome.decisions) <= {"approve", "review", "decline"}
    assert all(0 < count <= n for count in outcome.counts.values())
    for label, hits, card in zip(outcome.decisions, outcome.hits, cols.card_id, strict=True):
        assert ("deny:card" in hits) == (card in ("c-1", "💳"))
        if any(hit.startswith("deny:") for hit in hits):
            assert label == "decline"
    empty = Rules.EMPTY.decide(cols, feats, model_scores, DEFAULTS)
    assert empty.decisions == classify(model_scores, DEFAULTS)
    assert empty.hits == [()] * n
    assert empty.counts == {}


def test_empty_rules_are_classify() -> None:
    cols = columns(3)
    outcome = Rules.EMPTY.decide(cols, features(cols), scores(0.1, 0.5, 0.8), DEFAULTS)
    assert outcome.decisions == ["approve", "review", "decline"]
    assert outcome.hits == [(), (), ()]
    assert len(Rules.EMPTY) == 0
    assert rules("").summary() == Rules.EMPTY.summary() == "0 deny, 0 allow, 0 overrides, 0 rules"
