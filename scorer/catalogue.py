"""The feature catalogue: every column the service computes, what it means, and how a reason
code names it to a person.

A model package (`scorer/model_package.py`) names its inputs from this catalogue, rules
(`scorer/rules.py`) read it by name, and reason codes (`scorer/reasons.py`) turn a feature and
its value into a sentence. docs/features.md is generated from it:

    python -m scorer.catalogue > docs/features.md

A feature's text (its value in words, a reason's `text`) reads the transaction's whole
catalogue row, so one can relate two features ("7-day average 9.0x the card's 30-day
average"). Counts and amounts are stored as log(1 + x) (`LOG1P_FEATURES`); texts and rules read
them as x.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import NamedTuple

from contracts.reference_data import (
    COUNTRY_CURRENCIES,
    HIGH_RISK_COUNTRIES,
    MCC_FAMILIES,
    MCC_FAMILY_CODES,
    MCC_FAMILY_RANGES,
)
from contracts.terminal_risk import DELAY_DAYS, FRESH_WINDOWS_DAYS, TERMINAL_FEATURE_NAMES
from scorer.card_history_record import CARD_TESTING_WINDOW_MS, MAX_ZSCORE, RING_SIZE, WINDOW_NAMES
from scorer.features import FEATURE_NAMES, TINY_AMOUNT

#: A catalogue row by feature name → the feature's value in a short, human-readable sentence.
Text = Callable[[Mapping[str, float]], str]


class Feature(NamedTuple):
    name: str
    group: str
    description: str
    #: The feature's value in words, from a catalogue row: a reason's `text`.
    text: Text
    #: What the feature says something about, with the features that say the same thing
    #: otherwise (a card's four velocity windows): reason codes move them together.
    reason: str


#: exp() of more than this overflows a float.
_MAX_EXPONENT = 709.0


def _exp(value: float, minus_one: bool = False) -> float:
    """exp(value) (or expm1) that returns inf instead of overflowing, and NaN for NaN."""
    if math.isnan(value):
        return value
    clipped = min(value, _MAX_EXPONENT)
    return math.expm1(clipped) if minus_one else math.exp(clipped)


def _natural(value: float) -> float:
    """x from a feature stored as log(1 + x) (x >= 0)."""
    return _exp(max(value, 0.0), minus_one=True)


def _count(value: float) -> str:
    return f"{_natural(value):.0f}"


def _money(value: float) -> str:
    return f"{_natural(value):,.2f}"


def _ratio(row: Mapping[str, float], window: str) -> str:
    base = _natural(row["card_avg_amount_30d"])
    if not base > 0.0:
        return "no 30-day average yet"
    ratio = _natural(row[f"card_avg_amount_{window}"]) / base
    return f"{ratio:.1f}x the card's 30-day average"


def _flag(yes: str, no: str, name: str) -> Text:
    return lambda row: yes if row[name] >= 0.5 else no


_TRANSACTION = {
    "log_amount": "log(1 + amount)",
    "tiny_amount": f"1 if the amount is below {TINY_AMOUNT}",
    "round_amount": "1 if the amount is a multiple of 10",
    "channel_pos": "1 for a point-of-sale transaction",
    "channel_ecom": "1 for an e-commerce transaction",
    "channel_atm": "1 for an ATM withdrawal",
    "card_present": "1 if the card was physically present",
    "hour_sin": "sine of the local hour of day (UTC without utc_offset_minutes)",
    "hour_cos": "cosine of the local hour of day (UTC without utc_offset_minutes)",
    "night": "1 between 00:00 and 05:00 local time (UTC without utc_offset_minutes)",
    "mcc_everyday": "1 for everyday merchants (groceries, fuel, restaurants, pharmacies)",
    "mcc_travel": "1 for travel merchants (airlines, hotels, car rental, transport)",
    "mcc_digital": "1 for digital goods and online services",
    "mcc_high_value": "1 for high-value goods (electronics, jewellery, computers)",
    "mcc_cash": "1 for cash and quasi-cash (ATM, wire transfer, gambling)",
    "cross_border": (
        "1 if the card's currency is none of the merchant country's legal tenders (CLDR)"
    ),
    "high_risk_country": "1 if the merchant country is on the high-risk list",
    "weekend": "1 on Saturday and Sunday, local time (UTC without utc_offset_minutes)",
}
_HISTORY = {
    **{
        f"card_tx_{w}": f"log(1 + the card's transactions in the last {w}, this one included)"
        for w in WINDOW_NAMES
    },
    **{
        f"card_avg_amount_{w}": f"log(1 + the card's mean amount over the last {w})"
        for w in WINDOW_NAMES
    },
    "card_amount_to_mean": "log(1 + amount) - log(1 + the card's 30-day mean before it)",
    "card_amount_zscore": f"(amount - 30-day mean) / 30-day spread, clipped to ±{MAX_ZSCORE:g}",
    "card_since_previous": "log(1 + seconds since the card's previous transaction), ≤ 30 days",
    "card_distinct_merchants_1d": f"distinct merchants of the card's last {RING_SIZE} "
    "transactions in 1 day",
    "card_distinct_countries_1d": f"distinct countries of the card's last {RING_SIZE} "
    "transactions in 1 day",
    "card_testing_velocity": "log(1 + the card's small e-commerce amounts in the last "
    f"~{CARD_TESTING_WINDOW_MS // 60_000} min)",
}
_TERMINAL_KINDS = {
    "tx": "log(1 + the terminal's transactions from {w} to {d} days ago)",
    "risk": "confirmed frauds / transactions of the terminal, same days",
    "frauds": "log(1 + the terminal's confirmed frauds, same days)",
}
_TERMINAL = {
    name: _TERMINAL_KINDS[name.split("_")[1]].format(
        w=int(name.rsplit("_", 1)[1][:-1]) + DELAY_DAYS - 1, d=DELAY_DAYS
    )
    for name in TERMINAL_FEATURE_NAMES
    if not name.startswith("terminal_fresh_")
}
_TERMINAL.update(
    {
        f"terminal_fresh_frauds_{w}d": f"log(1 + the terminal's confirmed frauds on the last {w} "
        "days, today included, known so far: by report time, no delay)"
        for w in FRESH_WINDOWS_DAYS
    }
)
_CARD_FRAUDS = {
    f"card_fresh_frauds_{w}d": f"log(1 + the card's confirmed frauds on the last {w} days, "
    "today included, known so far: by report time, no delay)"
    for w in FRESH_WINDOWS_DAYS
}
_DESCRIPTIONS = {**_TRANSACTION, **_HISTORY, **_TERMINAL, **_CARD_FRAUDS}
_GROUPS = {
    **dict.fromkeys(_TRANSACTION, "transaction"),
    **dict.fromkeys(_HISTORY, "card history"),
    **dict.fromkeys(_TERMINAL, "terminal risk"),
    **dict.fromkeys(_CARD_FRAUDS, "card frauds"),
}


def _texts() -> dict[str, Text]:
    mcc = {
        "everyday": "everyday spending",
        "travel": "travel",
        "digital": "digital goods",
        "high_value": "high-value goods",
        "cash": "cash or quasi-cash",
    }
    texts: dict[str, Text] = {
        "log_amount": lambda r: f"amount {_money(r['log_amount'])}",
        "tiny_amount": _flag(
            "amount below 2, typical of a card-testing probe", "amount of 2 or more", "tiny_amount"
        ),
        "round_amount": _flag(
            "round amount (a multiple of 10)", "amount not round", "round_amount"
        ),
        "card_present": _flag("card present", "card not present", "card_present"),
        "hour_sin": _time_of_day,
        "hour_cos": _time_of_day,
        "night": _flag("at night (00-05h)", "not at night", "night"),
        "cross_border": _flag("cross-border (merchant abroad)", "domestic", "cross_border"),
        "high_risk_country": _flag(
            "merchant in a high-risk country",
            "merchant not in a high-risk country",
            "high_risk_country",
        ),
        "weekend": _flag("at the weekend", "on a weekday", "weekend"),
        "card_amount_to_mean": lambda r: (
            f"amount {_exp(r['card_amount_to_mean']):.1f}x the card's 30-day mean"
        ),
        "card_amount_zscore": lambda r: (
            f"amount {r['card_amount_zscore']:+.1f} standard deviations from the card's habit"
        ),
        "card_since_previous": lambda r: (
            f"{_duration(_natural(r['card_since_previous']))} since the card's previous transaction"
        ),
        "card_distinct_merchants_1d": lambda r: (
            f"{r['card_distinct_merchants_1d']:.0f} different merchants in a day"
        ),
        "card_distinct_countries_1d": lambda r: (
            f"{r['card_distinct_countries_1d']:.0f} different countries in a day"
        ),
        "card_testing_velocity": lambda r: (
            f"{_count(r['card_testing_velocity'])} small online payments in minutes"
        ),
    }
    for channel in ("pos", "ecom", "atm"):
        name = f"channel_{channel}"
        texts[name] = _flag(f"{channel} channel", f"not the {channel} channel", name)
    for family, words in mcc.items():
        name = f"mcc_{family}"
        texts[name] = _flag(f"merchant category: {words}", f"merchant category not {words}", name)
    for w, words in zip(WINDOW_NAMES, ("hour", "day", "7 days", "30 days"), strict=True):
        texts.update(_card_window_texts(w, words))
    for w in ("1d", "7d", "30d"):
        texts.update(_terminal_window_texts(w))
    for days in FRESH_WINDOWS_DAYS:
        texts[f"terminal_fresh_frauds_{days}d"] = _fresh_text("terminal", days)
        texts[f"card_fresh_frauds_{days}d"] = _fresh_text("card", days)
    return texts


def _card_window_texts(w: str, words: str) -> dict[str, Text]:
    def average(r: Mapping[str, float]) -> str:
        spend = f"{w} average spend {_money(r[f'card_avg_amount_{w}'])}"
        return spend if w == "30d" else f"{spend}, {_ratio(r, w)}"

    return {
        f"card_tx_{w}": lambda r: (
            f"{_count(r[f'card_tx_{w}'])} transactions on the card in the last {words}"
        ),
        f"card_avg_amount_{w}": average,
    }


def _terminal_window_texts(w: str) -> dict[str, Text]:
    span = "a day" if w == "1d" else f"{w[:-1]} days"
    return {
        f"terminal_tx_{w}": lambda r: (
            f"{_count(r[f'terminal_tx_{w}'])} transactions at the terminal over {span}"
        ),
        f"terminal_risk_{w}": lambda r: (
            f"{r[f'terminal_risk_{w}']:.0%} of the terminal's transactions over {span} were "
            "confirmed fraud"
        ),
        f"terminal_frauds_{w}": lambda r: (
            f"{_count(r[f'terminal_frauds_{w}'])} confirmed frauds at the terminal over {span}"
        ),
    }


def _fresh_text(entity: str, days: int) -> Text:
    name = f"{entity}_fresh_frauds_{days}d"
    span = "today and yesterday" if days == 2 else f"the last {days} days"
    where = "at the terminal" if entity == "terminal" else "on the card"
    return lambda r: f"{_count(r[name])} frauds confirmed {where} in {span}, reported so far"


#: Features that say the same thing, each list in the order a reason names them by (the first
#: that differs from the reference row); every other feature is a reason of its own.
REASON_GROUPS: dict[str, tuple[str, ...]] = {
    "amount": ("log_amount", "tiny_amount", "round_amount"),
    "channel": ("channel_ecom", "channel_atm", "channel_pos", "card_present"),
    "time of day": ("night", "hour_sin", "hour_cos"),
    "merchant category": tuple(f"mcc_{family}" for family in MCC_FAMILIES),
    "merchant country": ("high_risk_country", "cross_border"),
    "card velocity": tuple(f"card_tx_{w}" for w in WINDOW_NAMES),
    "card spend": tuple(f"card_avg_amount_{w}" for w in WINDOW_NAMES),
    "amount against the card's habit": ("card_amount_to_mean", "card_amount_zscore"),
    "card spread": ("card_distinct_countries_1d", "card_distinct_merchants_1d"),
    **{
        f"terminal {w} risk": tuple(f"terminal_{kind}_{w}" for kind in ("risk", "frauds", "tx"))
        for w in ("1d", "7d", "30d")
    },
    "terminal fresh frauds": tuple(f"terminal_fresh_frauds_{w}d" for w in FRESH_WINDOWS_DAYS),
    "card fresh frauds": tuple(f"card_fresh_frauds_{w}d" for w in FRESH_WINDOWS_DAYS),
}


def _catalogue() -> tuple[Feature, ...]:
    texts = _texts()
    reason = {name: group for group, names in REASON_GROUPS.items() for name in names}
    return tuple(
        Feature(name, _GROUPS[name], _DESCRIPTIONS[name], texts[name], reason.get(name, name))
        for name in FEATURE_NAMES
    )


def _time_of_day(row: Mapping[str, float]) -> str:
    angle = math.atan2(row["hour_sin"], row["hour_cos"])
    if not math.isfinite(angle):
        return "time of day unknown"
    return f"time of day {round(angle * 24 / (2 * math.pi)) % 24:02d}h"


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "a long time"
    for unit, size in (("day", 86_400.0), ("hour", 3_600.0), ("minute", 60.0)):
        if seconds >= size:
            amount = round(seconds / size)
            return f"{amount} {unit}{'s' if amount != 1 else ''}"
    return f"{seconds:.0f} s"


CATALOGUE: tuple[Feature, ...] = _catalogue()
#: Features stored as log1p(x): rules and texts read them as x (`natural_values`).
LOG1P_FEATURES: frozenset[str] = frozenset(
    feature.name
    for feature in CATALOGUE
    if feature.description.startswith("log(1 + ") and feature.name != "card_amount_to_mean"
)
BY_NAME: dict[str, Feature] = {feature.name: feature for feature in CATALOGUE}


def markdown() -> str:
    """docs/features.md."""
    lines = [
        "# Feature catalogue",
        "",
        "Generated by `python -m scorer.catalogue` from `scorer/catalogue.py`; do not edit.",
        "",
        "Every column the service computes for a transaction, in the order of its feature",
        "matrix. A model package's `features` (docs/models.md) names its inputs from this",
        "table, rules (docs/rules.md) read the same names, and reason codes describe them in",
        "a sentence of their own (`scorer/catalogue.py`).",
        "",
        "| # | feature | group | meaning |",
        "| ---: | --- | --- | --- |",
    ]
    lines += [
        f"| {i} | `{feature.name}` | {feature.group} | {feature.description} |"
        for i, feature in enumerate(CATALOGUE)
    ]
    lines += [
        "",
        "## Reference data",
        "",
        "The tables these features read (`contracts/reference_data.py`), with their sources:",
        "",
        f"- Currencies of {len(COUNTRY_CURRENCIES)} ISO 3166 countries (ISO 4217), from the "
        "Unicode CLDR as `babel` ships it (generated into `contracts/country_currencies.py` by "
        "`ops/tools/country_currencies.py`; a test compares them). `cross_border` is 1 when "
        "the card's currency is none of the merchant country's; a country with two "
        f"({', '.join(c for c, v in COUNTRY_CURRENCIES.items() if len(v) > 1)}) accepts "
        "either; a country CLDR does not know is cross-border.",
        "- Merchant category families (ISO 18245 codes; each named code and the range are "
        "checked against the `iso18245` package's list):",
        "",
        "| family | codes |",
        "| --- | --- |",
    ]
    for family, codes in MCC_FAMILY_CODES.items():
        spans = MCC_FAMILY_RANGES.get(family, ())
        named = [str(c) for c in codes if not any(low <= c <= high for low, high in spans)]
        lines.append(
            f"| `mcc_{family}` | {', '.join([*(f'{low}-{high}' for low, high in spans), *named])} |"
        )
    lines += [
        "",
        "  The range 3000-3999 holds the codes the card networks give individual airlines, "
        "car-rental companies and hotels. A code in no family is 0 in every `mcc_` column.",
        f"- High-risk merchant countries ({', '.join(sorted(HIGH_RISK_COUNTRIES))}): a curated "
        "list from card-fraud reports of card-not-present fraud, for each team to set.",
        "- Hour-of-day features (`hour_sin`, `hour_cos`, `night`), `weekend` and the rules' "
        "`hour` read the local time where the transaction gives its clock's offset "
        "(`utc_offset_minutes`; a mapped ISO-8601 time gives its own), and UTC otherwise. "
        "The shipped model was trained on UTC times (the simulator gives no offsets).",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
