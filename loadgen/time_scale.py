"""The pace of a load run's simulated clock, agreed with the scorer's history windows.

The simulator's world makes transactions at its natural rate (`TransactionSimulator.
natural_rate_per_s`, about 0.11 per second for the handbook's 5,000 cards), so a run at R tx/s
compresses simulated time by R / natural rate, and the scorer and fraud-features must shrink
their history windows by as much (FRAUD_HISTORY_TIME_SCALE). The population is fixed, so the
rate decides the compression: the load generator cannot send R tx/s at another scale, because
each card would then transact more often than its windows expect (against a scorer in real
time, every simulated card looks like a card on a spree). With the scorer's scale read from its
/metrics (`fraud_history_time_scale`):

- no --rate: send at the rate of the scorer's scale, when that is at least MIN_RATE_PER_S;
- a --rate within TOLERANCE of it: run the simulated clock at the scorer's scale exactly;
- any other --rate (or a scorer whose scale gives too low a rate): refuse, naming the
  FRAUD_HISTORY_TIME_SCALE to give the scorer and the worker;
- the scale unknown (no --metrics-url, the scorer not reachable, a scorer without the metric):
  run at the rate's own scale, and say so in a warning line.

A replay's rows keep their recorded event times: they need a scorer in real time (scale 1).
"""

from __future__ import annotations

from typing import NamedTuple

from plumbing.errors import ConfigurationError
from simulator.transactions import DEFAULT_CARDS, DEFAULT_START_TIME_MS, TransactionSimulator

#: How far a run's scale may be from the scorer's and still run at the scorer's: a card's
#: velocity features then differ by at most as much, far less than the simulated day itself
#: varies (its transactions cluster around noon, so its rate swings several times over).
TOLERANCE = 0.1
#: The least rate a run is sent at by the scorer's scale alone; a scorer in real time gives
#: about 0.11 tx/s, which measures nothing in a run of seconds.
MIN_RATE_PER_S = 1.0
#: A replay's event times are its rows' own.
REPLAY_SCALE = 1.0
#: The simulated world's terminals per card (the handbook's 10,000 for 5,000), as training's.
TERMINALS_PER_CARD = 2


class Pace(NamedTuple):
    """What a simulated run sends at and how compressed its simulated clock is."""

    #: --rate: the shape's rate parameter (the constant rate, the peak of diurnal, ...).
    rate: float
    #: Simulated seconds per event-time second: the scorer's FRAUD_HISTORY_TIME_SCALE.
    time_scale: float


def world(
    seed: int,
    cards: int = DEFAULT_CARDS,
    *,
    fraud_scale: float = 1.0,
    start_time_ms: int = DEFAULT_START_TIME_MS,
    id_prefix: str = "tx",
) -> TransactionSimulator:
    """The simulated world of a load run: `cards` customers, TERMINALS_PER_CARD times as many
    terminals, and the handbook's shares of fraud times `fraud_scale` (the other arguments as
    TransactionSimulator's). A smaller world makes fewer transactions per simulated day: at
    the same rate, its simulated days pass sooner."""
    return TransactionSimulator(
        seed,
        # The handbook's compromised terminals and cards per day are for its 5,000 cards.
        fraud_scale=fraud_scale * cards / DEFAULT_CARDS,
        num_cards=cards,
        num_terminals=TERMINALS_PER_CARD * cards,
        start_time_ms=start_time_ms,
        id_prefix=id_prefix,
    )


def time_scale(seed: int, rate_per_s: float, cards: int = DEFAULT_CARDS) -> float:
    """How many times faster than the simulated clock the simulator's events run when it is
    asked for `rate_per_s` (what `generate` compresses time by), in a world of `cards` cards. A
    service given it as its FRAUD_HISTORY_TIME_SCALE sees each card's windows as the simulated
    card lived them: without it, five simulated days squeezed into ten seconds make every card a
    burst of velocity and the model flags a share of traffic no payment stream has."""
    return rate_per_s / world(seed, cards).natural_rate_per_s


def setting(scale: float) -> str:
    """The environment setting that gives a service `scale`, as a user types it."""
    return f"FRAUD_HISTORY_TIME_SCALE={round(scale, 1):g}"


def simulated_pace(
    scorer_scale: float | None,
    *,
    rate: float,
    rate_given: bool,
    rate_per_mean: float,
    natural_rate: float,
    where: str,
) -> Pace:
    """The run's pace against a scorer at `scorer_scale` (None: unknown).

    `rate`: --rate, or the shape's default when not `rate_given`; `rate_per_mean`: --rate over
    the schedule's mean rate (1 for a constant shape); `natural_rate`: the simulator's, per
    simulated second; `where`: the scorer's metrics URL, for the messages.

    Raises:
        ConfigurationError: the run cannot agree with the scorer; the message says what to set.
    """
    own_scale = rate / rate_per_mean / natural_rate
    if scorer_scale is None:
        return Pace(rate, own_scale)
    scorer_rate = scorer_scale * natural_rate * rate_per_mean
    if not rate_given and scorer_rate >= MIN_RATE_PER_S:
        return Pace(scorer_rate, scorer_scale)
    if rate_given and abs(own_scale / scorer_scale - 1.0) <= TOLERANCE:
        return Pace(rate, scorer_scale)
    instead = (
        f", or send --rate {scorer_rate:.4g} (the scorer's pace)"
        if scorer_rate >= MIN_RATE_PER_S
        else ""
    )
    raise ConfigurationError(
        f"{rate:g} tx/s of the simulated cards runs simulated time {own_scale:.1f}x real time, "
        f"but the scorer at {where} runs its history windows at {setting(scorer_scale)}: start "
        f"fraud-scorer and fraud-features with {setting(own_scale)}{instead}"
    )


def check_replay(scorer_scale: float | None, *, where: str) -> None:
    """Refuse a replay against a scorer in compressed time (None: unknown, accepted).

    Raises:
        ConfigurationError: the scorer's scale is not 1; the message says what to set.
    """
    if scorer_scale is not None and abs(scorer_scale / REPLAY_SCALE - 1.0) > TOLERANCE:
        raise ConfigurationError(
            f"the replayed rows keep their recorded event times, but the scorer at {where} "
            f"runs its history windows at {setting(scorer_scale)}: start fraud-scorer and "
            f"fraud-features with {setting(REPLAY_SCALE)} (the default)"
        )


def assumption(scale: float, rate: float | None, why: str) -> str:
    """The warning of a run that could not read the scorer's scale (`why`); `rate`: the run's
    --rate, None for a replay."""
    pace = "the replay's" if rate is None else f"this run's, for {rate:g} tx/s"
    return (
        f"fraud-loadgen: warning: the scorer's history time scale is unknown ({why}); assuming "
        f"fraud-scorer and fraud-features run at {setting(scale)} ({pace}); at another, card "
        "histories do not mean what the model learned"
    )
