"""`python -m faults`: run the fault scenarios against the suite's own broker, print one line of
figures per scenario and a final table, exit 1 if any check failed.

    python -m faults                          the full suite, both modes (make faults)
    python -m faults --short                  CI's version: scenarios 1, 3, 4, 5, shorter
    python -m faults --mode exactly-once --scenario 2 3
    python -m faults --scenario 7             the rolling upgrade from release 0.1.0
                                              (make upgrade-check)
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from faults.broker import DEFAULT_PORT, DEFAULT_STATE_DIR, REPO, Broker
from faults.harness import ScenarioRun
from faults.release import DEFAULT_ROOT as DEFAULT_RELEASE_ROOT
from faults.release import FIRST_RELEASE, FIRST_RELEASE_COMMIT, install_release
from faults.results import Result, Settings
from faults.scenarios import SCENARIOS, Scenario
from faults.timing import FULL, SHORT, Timing
from plumbing.environment import check_environment
from plumbing.errors import ConfigurationError

log = logging.getLogger("faults")

#: What --short runs: the broker restart (2) alone takes a minute per mode (10 s down, a JVM
#: start, the backlog), which CI's time budget does not have; `make faults` runs it. So does
#: the rebalance with held state (6): 27 to 46 s a mode at the short size (50,000 cards), more
#: than CI can add, and a figure to measure more than a guarantee to keep.
SHORT_SCENARIOS = (1, 3, 4, 5)
#: The scenario that needs a release installed (`faults/release.py`).
UPGRADE = 7

MODES = {"at-least-once": (False,), "exactly-once": (True,), "both": (False, True)}
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m faults",
        description="Fault-injection scenarios against a broker of the suite's own, each checked "
        "by the verifier (one outcome per input record, duplicates, per-card order, lag, "
        "pauses, the in-flight bounds).",
    )
    parser.add_argument(
        "--short",
        action="store_true",
        help="CI's version: a fifth of the load, shorter windows, one kill, 50,000 cards held "
        "instead of 1,000,000, and scenarios "
        f"{', '.join(map(str, SHORT_SCENARIOS))} unless --scenario says otherwise",
    )
    parser.add_argument(
        "--mode",
        choices=sorted(MODES),
        default="both",
        help="processing guarantee of the replicas (default: both, one after the other)",
    )
    parser.add_argument(
        "--scenario",
        type=int,
        nargs="+",
        choices=sorted(SCENARIOS),
        help="scenarios to run (default: all): "
        + ", ".join(f"{s.number} {s.name}" for s in SCENARIOS.values()),
    )
    parser.add_argument(
        "--rate",
        type=float,
        help=f"load, transactions/s (default: {FULL.rate:g}, --short: {SHORT.rate:g})",
    )
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help="the suite's broker (controller: +1)"
    )
    parser.add_argument(
        "--max-in-flight-records",
        type=int,
        default=Settings.max_in_flight_records,
        help="each replica's bound on undecided records (default: %(default)s, small so that "
        "the bound is exercised; the service's own default is 10,000)",
    )
    parser.add_argument(
        "--max-in-flight-bytes",
        type=int,
        default=Settings.max_in_flight_bytes,
        help="each replica's bound on those records' bytes (default: %(default)s; the "
        "service's own default is 67,108,864)",
    )
    parser.add_argument(
        "--state-warm-up",
        choices=("on", "off"),
        default=Settings.state_warm_up,
        help="scenario 6: whether its replicas read every partition's card state before they "
        "join the group (the service's FRAUD_STATE_WARM_UP, off by default there; "
        "default here: %(default)s)",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=DEFAULT_STATE_DIR,
        help="the suite's broker's data and logs (default: %(default)s)",
    )
    parser.add_argument(
        "--log-dir",
        type=Path,
        default=REPO / ".faults-logs",
        help="replica logs go to a folder per run under this one",
    )
    parser.add_argument(
        "--release-root",
        type=Path,
        default=DEFAULT_RELEASE_ROOT,
        help=f"scenario 7 installs release {FIRST_RELEASE} (commit {FIRST_RELEASE_COMMIT[:12]}) "
        "into a virtualenv under this folder, or uses the one there (default: %(default)s)",
    )
    parser.add_argument(
        "--keep-broker", action="store_true", help="leave the broker running at the end"
    )
    parser.add_argument(
        "--keep-topics", action="store_true", help="leave each scenario's topics (evidence)"
    )
    return parser


def run_one(
    broker: Broker,
    scenario: Scenario,
    settings: Settings,
    timing: Timing,
    log_dir: Path,
    keep_topics: bool,
) -> Result:
    """Run one scenario in one mode; a scenario that breaks off fails with the reason."""
    if not broker.running:
        broker.up()
    with ScenarioRun(
        broker, f"{scenario.number}", settings, log_dir, keep_topics=keep_topics
    ) as run:
        try:
            scenario.run(run, timing)
        except Exception as exc:
            log.exception("scenario %s (%s) broke off", scenario.number, settings.mode)
            run.result.check("scenario ran to its end", False, f"{type(exc).__name__}: {exc}")
            if not broker.running:
                broker.up()
        try:
            run.finish()
        except Exception as exc:
            log.exception("scenario %s (%s): the checks broke off", scenario.number, settings.mode)
            run.result.check("checks ran to their end", False, f"{type(exc).__name__}: {exc}")
    return run.result


def figures_line(scenario: Scenario, result: Result) -> str:
    """One line: what the scenario found."""
    head = f"[{scenario.number} {scenario.name} | {result.mode}] "
    head += "PASS" if result.passed else "FAIL"
    parts = []
    report = result.report
    if report is not None:
        recovery = ", ".join(f"{s:.1f}" for s in report.recovery_s)
        parts += [
            f"inputs={report.inputs}",
            f"decided={report.decided}",
            f"dead-lettered={report.dead_lettered}",
            f"lost={report.lost}",
            f"duplicates={report.duplicates} (outside faults {report.duplicates_outside_faults},"
            f" differing {report.duplicates_not_identical},"
            f" rescored {report.duplicates_rescored})",
            f"order-violations={report.order_violations}",
            f"recover=[{recovery}]s",
            f"max-latency={report.max_latency_s:.1f}s",
        ]
    parts += [f"{k}={v}" for k, v in result.figures.items()]
    parts.append(f"took={result.seconds:.0f}s")
    return head + " " + " ".join(parts)


def table(rows: list[tuple[Scenario, Result]]) -> str:
    """The summary: scenario by mode → lost / duplicates / time to recover."""
    lines = [
        "| scenario | mode | lost | duplicates | time to recover | result |",
        "| --- | --- | ---: | ---: | ---: | --- |",
    ]
    for scenario, result in rows:
        report = result.report
        lost = str(report.lost) if report else "?"
        duplicates = str(report.duplicates) if report else "?"
        recover = f"{max(report.recovery_s, default=0.0):.1f} s" if report else "?"
        verdict = "pass" if result.passed else "**FAIL**"
        lines.append(
            f"| {scenario.number}. {scenario.name} | {result.mode} | {lost} | {duplicates} "
            f"| {recover} | {verdict} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        # Its replicas inherit the environment: the scorer's variables are read there.
        for warning in check_environment("python -m faults", passes_on=("fraud-scorer",)):
            print(f"python -m faults: {warning}", file=sys.stderr)
    except ConfigurationError as exc:
        print(f"python -m faults: configuration error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.rate is not None and not args.rate > 0:
        print(f"python -m faults: --rate must be > 0, got {args.rate}", file=sys.stderr)
        return EXIT_USAGE
    if args.max_in_flight_records < Settings.max_batch_size:
        print(
            f"python -m faults: --max-in-flight-records must be >= the replicas' batch size "
            f"{Settings.max_batch_size}, got {args.max_in_flight_records}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if args.max_in_flight_bytes < 1_048_576:
        print(
            f"python -m faults: --max-in-flight-bytes must be >= 1048576 (the service's "
            f"least), got {args.max_in_flight_bytes}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    timing = SHORT if args.short else FULL
    numbers = args.scenario or (SHORT_SCENARIOS if args.short else sorted(SCENARIOS))
    if args.rate is not None:
        timing = dataclasses.replace(timing, rate=args.rate)
    log_dir = args.log_dir / time.strftime("%Y%m%d-%H%M%S")
    try:
        release = install_release(root=args.release_root) if UPGRADE in numbers else None
    except ConfigurationError as exc:
        print(f"python -m faults: {exc}", file=sys.stderr)
        return EXIT_FAILED
    broker = Broker(args.port, args.state_dir)
    started_here = not broker.running
    started = time.monotonic()
    rows: list[tuple[Scenario, Result]] = []
    try:
        broker.up()
        for exactly_once in MODES[args.mode]:
            for number in numbers:
                scenario = SCENARIOS[number]
                settings = Settings(
                    exactly_once,
                    rate=timing.rate,
                    max_in_flight_records=args.max_in_flight_records,
                    max_in_flight_bytes=args.max_in_flight_bytes,
                    state_warm_up=args.state_warm_up,
                    release=release,
                )
                result = run_one(broker, scenario, settings, timing, log_dir, args.keep_topics)
                rows.append((scenario, result))
                print(figures_line(scenario, result), flush=True)
                for check in result.checks:
                    if not check.ok:
                        print(f"    FAILED {check.name}: {check.detail}", flush=True)
    finally:
        if started_here and not args.keep_broker:
            broker.down()
    print(table(rows))
    failed = sum(not r.passed for _, r in rows)
    print(
        f"{len(rows) - failed}/{len(rows)} passed in {time.monotonic() - started:.0f}s; "
        f"replica logs in {log_dir}",
        flush=True,
    )
    return EXIT_FAILED if failed else EXIT_OK
