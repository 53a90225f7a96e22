"""The data of a fold: which rows of a simulated stream it trains on and is assessed on, and
what its model learns as fraud.

The handbook's protocol decides the weeks (training/protocol.py); this module applies them to
a replayed stream, with what the service itself would know: rows whose card serving already
knows to be compromised are left out of every assessed week, every fold also trains on the
stream's first days (cold start), and under the realistic label regimes a model learns only
the frauds reported before it goes live.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from contracts.terminal_risk import FRESH_WINDOWS_DAYS, MS_PER_DAY
from scorer.features import FEATURE_NAMES
from simulator.label_regimes import LabelRegime
from simulator.replay import Stream
from simulator.transactions import DEFAULT_START_TIME_MS
from training.protocol import Fold, assessed_days, handbook_fold

#: Every fold also trains on the stream's first days, when every card and terminal is new: the
#: service meets such cards at start-up and for every new card, and a model trained on steady
#: state only flagged 6-8 % of their legitimate transactions on day 0 (3 % over a new stream's
#: first 10 days, 1 % in steady state). Chosen on the validation folds and on the first days of
#: an independent stream (seed + COLD_CHECK_SEED_OFFSET), never on a test week.
COLD_START_DAYS = 7
#: Confirmed frauds known so far, without the delay (`scorer/terminal_risk.py`): the handbook's
#: setting has nothing like them (its outcomes arrive after the delay), so the card also reports
#: the chosen candidate without them, on the first seed only (it costs a model per test fold).
#: A row whose card this feature counts a confirmed fraud for is left out of every assessed
#: week: the service knows the card is compromised (within hours of a report), so the row tests
#: what serving already knows, not the model. The widest of the card's fresh-label windows.
KNOWN_COMPROMISED_FEATURE = f"card_fresh_frauds_{max(FRESH_WINDOWS_DAYS)}d"
FRESH_LABEL_COLUMNS = tuple(
    f"{entity}_fresh_frauds_{w}d" for entity in ("terminal", "card") for w in FRESH_WINDOWS_DAYS
)

_Ints = npt.NDArray[np.int64]


def stream_fold(stream: Stream, train_start_day: int) -> Fold:
    """A fold of `stream`: known-compromised cards removed by the handbook's rule, and every row
    whose card the service already knows to be compromised when it scores it: a fraud of the
    card confirmed within KNOWN_COMPROMISED_FEATURE's window, as its own feature says."""
    known = stream.features[:, FEATURE_NAMES.index(KNOWN_COMPROMISED_FEATURE)] > 0
    return handbook_fold(stream.day, stream.card, stream.is_fraud, train_start_day, known)


def training_rows(stream: Stream, week: _Ints) -> _Ints:
    """A fold's training rows: the stream's first COLD_START_DAYS days, then its training week."""
    cold = np.flatnonzero(stream.day < COLD_START_DAYS)
    return np.concatenate([cold, week[stream.day[week] >= COLD_START_DAYS]])


def training_targets(stream: Stream, train_start_day: int, rows: _Ints) -> npt.NDArray[np.bool_]:
    """What a model trained on these rows of the fold learns as fraud.

    Under the ``today`` regime, every fraud, as the handbook's protocol assumes (its outcomes
    are known after the delay week). Under the others, only the frauds reported before the
    model goes live, on the first day of the week it is assessed on: a fraud not yet reported
    reads as legitimate, as it does to a team that retrains. Assessment always reads every
    outcome (the truth the simulator knows).
    """
    if stream.regime is LabelRegime.TODAY:
        return stream.is_fraud[rows]
    go_live_ms = DEFAULT_START_TIME_MS + assessed_days(train_start_day)[0] * MS_PER_DAY
    return stream.is_fraud[rows] & (stream.reported_at[rows] < go_live_ms)
