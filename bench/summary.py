"""The figures of `make bench` from its rounds: medians, spreads, ratios, budgets, the table.

Every contender runs once per round, the rounds one after the other, so a busy moment of the
shared machine slows one round of every contender rather than all rounds of one. A ratio is
taken within each round (the two contenders ran minutes apart at most) and its median over the
rounds is reported, with the spread (lowest and highest) beside it.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from bench.contenders import CONTENDERS, LABELS, LATENCY_RATE, PIPELINE_FLAGS
from bench.harness import Measurement

SECONDS_PER_HOUR = 3_600.0
PER_MILLION = 1_000_000.0
Round = dict[str, Measurement]
#: (figure, numerator contender, denominator contender)
RATIOS: tuple[tuple[str, str, str], ...] = (
    ("pipeline_vs_passthrough", "pipeline", "passthrough"),
    ("floor_vs_passthrough", "floor", "passthrough"),
    ("pipeline_vs_floor", "pipeline", "floor"),
    ("pipeline_vs_faust", "pipeline", "faust"),
    ("pipeline_vs_quix", "pipeline", "quix"),
    ("pipeline_vs_per_record", "pipeline", "per_record"),
    ("pipeline_vs_stateless", "pipeline", "pipeline_stateless"),
    ("eos_vs_at_least_once", "pipeline_eos", "pipeline"),
    ("reasons_on_vs_off", "pipeline", "pipeline_no_reasons"),
    ("features_logged_vs_not", "pipeline_features", "pipeline"),
)
#: The latency runs at LATENCY_RATE: (contender, JSON name of its p99, how the table says it).
LATENCY_FIGURES: tuple[tuple[str, str, str], ...] = (
    ("pipeline", "p99_ms_at_5000", ""),
    ("pipeline_eos", "p99_ms_at_5000_eos", ", exactly-once"),
    ("pipeline_no_reasons", "p99_ms_at_5000_no_reasons", ", reasons off"),
    ("quix", "p99_ms_at_5000_quix", ", Quix Streams"),
)
#: The JSON name of each contender's throughput.
TPS_NAMES = {
    "passthrough": "passthrough_tps",
    "floor": "floor_tps",
    "pipeline": "pipeline_tps",
    "pipeline_stateless": "pipeline_stateless_tps",
    "pipeline_eos": "eos_tps",
    "pipeline_no_reasons": "pipeline_no_reasons_tps",
    "pipeline_features": "pipeline_features_tps",
    "faust": "faust_tps",
    "quix": "quix_tps",
    "per_record": "per_record_tps",
}


def cost_per_million(records_per_s: float | None, price_per_hour: float) -> float | None:
    """USD per million decisions for a machine doing `records_per_s` at `price_per_hour`."""
    if not records_per_s:
        return None
    return round(price_per_hour / (records_per_s * SECONDS_PER_HOUR) * PER_MILLION, 5)


def _median(values: Sequence[float | None]) -> tuple[float | None, list[float] | None]:
    known = [v for v in values if v is not None]
    if not known:
        return None, None
    return statistics.median(known), [min(known), max(known)]


def figures(
    rounds: Sequence[Round], latencies: Mapping[str, dict[str, Any]], price: float
) -> dict[str, Any]:
    """The headline numbers (the keys of the final JSON line): median per figure, and per
    figure its spread over the rounds and the shortest window it was measured over.
    `latencies`: the latency run of each contender of LATENCY_FIGURES that had one."""
    values: dict[str, Any] = {"runs": len(rounds)}
    spread: dict[str, list[float] | None] = {}
    window_s: dict[str, float] = {}
    for name in CONTENDERS:
        rates = [r[name].records_per_s for r in rounds]
        median, spread[TPS_NAMES[name]] = _median(rates)
        values[TPS_NAMES[name]] = None if median is None else round(median, 1)
        window_s[TPS_NAMES[name]] = round(min(r[name].window_s for r in rounds), 2)
    for figure, top, bottom in RATIOS:
        ratios = [_ratio(r[top].records_per_s, r[bottom].records_per_s) for r in rounds]
        median, spread[figure] = _median(ratios)
        values[figure] = None if median is None else round(median, 2)
    for name in PIPELINE_FLAGS:
        shares = [r[name].flagged_share for r in rounds]
        median, spread[f"{name}_flagged_share"] = _median(shares)
        values[f"{name}_flagged_share"] = None if median is None else round(median, 4)
    for name, figure, _label in LATENCY_FIGURES:
        values[figure] = latencies.get(name, {}).get("p99_ms")
    # Quix's records not decided when the run's drain ended: its p99 then leaves out its latest
    # decisions, and the ratio is a lower bound.
    values["quix_undecided_at_5000"] = latencies.get("quix", {}).get("lost")
    slower = _ratio(values["p99_ms_at_5000_quix"], values["p99_ms_at_5000"])
    values["quix_p99_vs_pipeline"] = None if slower is None else round(slower, 2)
    values["cost_per_million_decisions_usd"] = cost_per_million(values["pipeline_tps"], price)
    values["price_per_hour_usd"] = price
    values["window_s"] = window_s
    values["spread"] = {
        key: None if pair is None else [round(pair[0], 4), round(pair[1], 4)]
        for key, pair in spread.items()
    }
    return values


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def check_bounds(bounds: list[dict[str, Any]], values: dict[str, Any]) -> list[dict[str, Any]]:
    """Each bound with the measured value and whether it was met (unmeasured: missed)."""
    checked = []
    for bound in bounds:
        value = values.get(bound["metric"])
        if value is None:
            met = False
        elif "min" in bound:
            met = value >= bound["min"]
        else:
            met = value <= bound["max"]
        checked.append({**bound, "value": value, "met": met})
    return checked


def render_table(rounds: Sequence[Round], values: dict[str, Any], price: float) -> str:
    """The human-readable results."""
    lines = [
        f"{'contender':<28} {'records/s (median)':>18} {'spread':>21} {'window s':>9} "
        f"{'USD per M':>10}",
    ]
    for name in CONTENDERS:
        key = TPS_NAMES[name]
        rate, pair = values[key], values["spread"][key]
        cost = cost_per_million(rate, price)
        lines.append(
            f"{LABELS[name]:<28} {'n/a' if rate is None else f'{rate:,.0f}':>18} "
            f"{'n/a' if pair is None else f'{pair[0]:,.0f} to {pair[1]:,.0f}':>21} "
            f"{values['window_s'][key]:>9.1f} {'n/a' if cost is None else f'{cost:.4f}':>10}"
        )
    for figure, _top, _bottom in RATIOS:
        pair = values["spread"][figure]
        shown = "n/a" if values[figure] is None else f"{values[figure]:g}"
        if pair is not None:
            shown += f" ({pair[0]:g} to {pair[1]:g})"
        lines.append(f"{figure:<28} {shown}")
    shares = {LABELS[n]: values[f"{n}_flagged_share"] for n in PIPELINE_FLAGS}
    lines.append(
        "reviews and declines: "
        + ", ".join(f"{label} {'n/a' if s is None else f'{s:.2%}'}" for label, s in shares.items())
    )
    for _name, key, label in LATENCY_FIGURES:
        p99 = values[key]
        lines.append(
            f"p99 event→decision at an open-loop {LATENCY_RATE:,.0f} tx/s{label}: "
            + ("not measured" if p99 is None else f"{p99:g} ms")
        )
    if values["quix_p99_vs_pipeline"] is not None:
        undecided = values["quix_undecided_at_5000"]
        lines.append(
            f"{'quix_p99_vs_pipeline':<28} {values['quix_p99_vs_pipeline']:g}"
            + (f" (a lower bound: {undecided:,} Quix records undecided)" if undecided else "")
        )
    for index, round_ in enumerate(rounds, start=1):
        loads = ", ".join(f"{m.name} {m.load_average_before}" for m in round_.values())
        lines.append(f"round {index} load average before each: {loads}")
    return "\n".join(lines)


def render_bounds(checked: list[dict[str, Any]]) -> str:
    """One PASS/MISS line per bound."""
    lines = []
    for bound in checked:
        limit = f">= {bound['min']}" if "min" in bound else f"<= {bound['max']}"
        value = "not measured" if bound["value"] is None else bound["value"]
        lines.append(
            f"{'PASS' if bound['met'] else 'MISS'}  {bound['metric']} {limit}: {value}"
            f"  ({bound['why']})"
        )
    return "\n".join(lines)
