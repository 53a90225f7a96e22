"""A publication round's records (terminals/publication.py): encoded a round at a time, the
features computed for every terminal in one call, they are the records each entry would have
alone, byte for byte, tombstones and cards included."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.card_frauds import decode_card_frauds
from contracts.terminal_risk import MS_PER_DAY, decode_terminal_risk
from terminals.events import TerminalEvent
from terminals.publication import encode_publications
from terminals.state import Publication, TerminalState
from terminals.table_clock import TerminalClock

DAY0 = 20_000


@st.composite
def entries(draw: st.DrawFn) -> list[tuple[str, Publication]]:
    """Up to 12 entries, each counted from a few transactions and labels over 60 days; some
    moved past every window of their counts after a first publication (a tombstone)."""
    taken = []
    for n in range(draw(st.integers(0, 12))):
        clock = TerminalClock(MS_PER_DAY)
        state = TerminalState()
        for offset in range(draw(st.integers(1, 8))):
            day = DAY0 + draw(st.integers(0, 60))
            if draw(st.booleans()):
                event = TerminalEvent("t", 0, offset, day * MS_PER_DAY)
            else:
                reported = (day + draw(st.integers(0, 9))) * MS_PER_DAY
                event = TerminalEvent("l", 0, offset, day * MS_PER_DAY, True, reported, f"x{n}")
            state.apply(event, clock)
        publication = state.take_publication()
        if draw(st.booleans()):  # later, a report 90 days on: nothing a window reads is left
            state.apply(TerminalEvent("l", 1, 0, DAY0 * MS_PER_DAY, False, 0), clock)
            state.apply(TerminalEvent("t", 1, 1, (DAY0 + 150) * MS_PER_DAY), clock)
            publication = state.take_publication() or publication
        if publication is not None:
            taken.append((f"key-{n}", publication))
    return taken


@settings(max_examples=100, deadline=None)
@given(entries(), st.booleans())
def test_a_round_encodes_each_entry_as_it_would_be_alone(
    taken: list[tuple[str, Publication]], card: bool
) -> None:
    together = encode_publications(taken, card=card)
    alone = [encode_publications([entry], card=card)[0] for entry in taken]
    assert together == alone
    for (key, publication), value in zip(taken, together, strict=True):
        assert (value is None) == (publication.buckets is None)
        if value is None:
            continue
        record = decode_card_frauds(value) if card else decode_terminal_risk(value)
        assert (record.as_of_day, getattr(record, "terminal_id", key)) == (
            publication.as_of_day,
            key,
        )
