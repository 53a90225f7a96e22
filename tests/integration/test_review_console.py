"""`fraud-review` on the real broker: flagged decisions become cases with their transactions'
fields, the API needs credentials (and, with a session, its CSRF token), a verdict becomes one
label with its reviewer, a restart keeps everything, and hostile input is refused or shown as
text."""

from __future__ import annotations

import json
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.conftest import encode, produce, read_topic
from tests.integration.review_console import ANALYST, LEAD, ReviewConsole, basic, request
from tests.support.topics import create_topics, delete_topics

NOW_MS = int(time.time() * 1000)


def transaction(tid: str, card: str, amount: float, merchant: str = "m-1") -> dict[str, Any]:
    return {
        "transaction_id": tid, "card_id": card, "merchant_id": merchant, "amount": amount,
        "currency": "EUR", "mcc": 5411, "country": "FR", "channel": "ecom",
        "card_present": False, "event_time": NOW_MS, "terminal_id": f"T-{tid}",
        "utc_offset_minutes": 60,
    }  # fmt: skip


def decision(tid: str, card: str, score: float, verdict: str = "review") -> dict[str, Any]:
    """A decision as the scorer writes it: a reason's words as `text` and, deprecated, `label`."""
    words = f"amount of {tid}"
    return {
        "transaction_id": tid, "card_id": card, "score": score, "decision": verdict,
        "model_version": "fraud-gbdt-test", "degraded": False, "event_time": NOW_MS,
        "decided_at": NOW_MS + 20,
        "reasons": [{"feature": "amount", "text": words, "label": words, "contribution": 0.3}],
        "rules": ["night_ecom"],
    }  # fmt: skip


@pytest.fixture
def console_factory(admin: AdminClient, tmp_path: Path) -> Iterator[Callable[..., ReviewConsole]]:
    made: list[ReviewConsole] = []
    topics: list[str] = []

    def make(*extra: str) -> ReviewConsole:
        suffix = uuid.uuid4().hex[:10]
        names = (f"decisions-{suffix}", f"tx-{suffix}", f"labels-{suffix}")
        topics.extend(create_topics(admin, [NewTopic(name, 2, 1) for name in names]))
        console = ReviewConsole(*names, tmp_path / f"review-{suffix}.db",
                                tmp_path / f"review-{suffix}.log", extra)  # fmt: skip
        for (name, password), role in ((ANALYST, "analyst"), (LEAD, "lead")):
            added = console.add_user(name, password, role)
            assert added.returncode == 0, added.stderr
        made.append(console)
        return console

    yield make
    for console in made:
        console.kill()
    delete_topics(admin, topics)


def test_flagged_decisions_become_cases_queued_by_expected_loss(console_factory) -> None:
    console = console_factory().start()
    # c-2's transaction is read after its decision: its case gets the fields when it comes.
    produce(
        console.transactions,
        [
            (b"k", encode(transaction("t-1", "card-a", 40.0))),
            (b"k", encode(transaction("t-3", "card-b", 900.0))),
        ],
    )
    produce(console.decisions, [
        (b"k", encode(decision("t-0", "card-a", 0.01, "approve"))),
        (b"k", encode(decision("t-1", "card-a", 0.50))),
        (b"k", encode(decision("t-2", "card-a", 0.30))),
        (b"k", encode(decision("t-3", "card-b", 0.10))),
        (b"k", encode(decision("t-4", "card-b", 0.95, "decline"))),
        (b"k", encode(decision("t/6", "card-c", 0.001))),
        (b"k", b'{"transaction_id": "t-5", "score": "high"}'),
        (b"k", b"\xff not json"),
        (b"k", b"[" * 60_000),
        (b"k", b"[" * 100_000),
    ])  # fmt: skip
    produce(console.transactions, [(b"k", encode(transaction("t-2", "card-a", 1_000.0)))])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        cases = console.cases()
        if len(cases) == 4 and sum(case["amount"] is not None for case in cases) == 3:
            break
        time.sleep(0.2)
    # Approvals and (by default) declines open no case; expected loss orders the queue (t/6's
    # transaction never comes: its score alone orders it).
    assert [(c["transaction_id"], c["expected_loss"]) for c in cases] == [
        ("t-2", pytest.approx(300.0)), ("t-3", pytest.approx(90.0)), ("t-1", pytest.approx(20.0)),
        ("t/6", pytest.approx(0.001)),
    ]  # fmt: skip
    # An id with a slash is a case like any other (the page sends it as %2F).
    assert console.case("t/6").json()["card_id"] == "card-c"
    assert console.verdict("t/6", False).json()["result"] == "closed"
    assert console.get("/api/cases/t/6", basic(ANALYST)).status == 404
    first = console.case("t-2").json()
    assert first["merchant_id"] == "m-1" and first["terminal_id"] == "T-t-2"
    assert first["reasons"] == [
        {"feature": "amount", "text": "amount of t-2", "label": "amount of t-2",
         "contribution": 0.3}
    ]  # fmt: skip
    assert first["rules"] == ["night_ecom"]
    assert [d["decision"] for d in first["timeline"]] == ["approve", "review"]
    assert [d["score"] for d in first["timeline"]] == [pytest.approx(0.01), pytest.approx(0.5)]
    assert {c["transaction_id"] for c in first["card_cases"]} == {"t-1"}
    assert console.metric("fraud_review_cases_opened_total") == 4
    skipped = 'fraud_review_records_skipped_total{{reason="{}",topic="{}"}}'
    assert console.metric(skipped.format("invalid", console.decisions)) == 3
    assert console.metric(skipped.format("too_large", console.decisions)) == 1
    # The transactions topic is bounded the same way: skipped, counted, the join unharmed.
    produce(
        console.transactions, [(b"k", b"[" * 100_000), (b"k", b'{"amount": "x"}'), (b"k", None)]
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if console.metric(skipped.format("invalid", console.transactions)) == 2:
                break
        except AssertionError:  # no sample for that topic yet
            pass
        time.sleep(0.2)
    assert console.metric(skipped.format("invalid", console.transactions)) == 2
    assert console.metric(skipped.format("too_large", console.transactions)) == 1
    assert len(console.cases()) == 3  # t/6 closed above; the rest unchanged


def test_a_decision_of_release_010_shows_its_reason_by_its_label(console_factory) -> None:
    console = console_factory().start()
    written_by_010 = decision("t-010", "card-a", 0.5)
    written_by_010["reasons"] = [
        {"feature": "amount", "label": "amount of t-010", "contribution": 0.3}
    ]  # 0.1.0 had no `text`
    produce(console.decisions, [(b"k", encode(written_by_010))])
    assert [c["transaction_id"] for c in console.wait_for_cases(1)] == ["t-010"]
    assert console.case("t-010").json()["reasons"] == [
        {"feature": "amount", "text": "amount of t-010", "label": "amount of t-010",
         "contribution": 0.3}
    ]  # fmt: skip


def test_declines_open_cases_where_configured(console_factory) -> None:
    console = console_factory("--review-declines", "on").start()
    produce(console.decisions, [(b"k", encode(decision("t-1", "c", 0.9, "decline"))),
                                (b"k", encode(decision("t-2", "c", 0.2)))])  # fmt: skip
    assert {c["decision"] for c in console.wait_for_cases(2)} == {"decline", "review"}


def test_the_api_refuses_requests_without_good_credentials(console_factory) -> None:
    console = console_factory().start()
    for path in ("/api/cases", "/api/cases/t-1"):
        refused = console.get(path)
        assert refused.status == 401
        assert refused.headers["www-authenticate"].startswith("Basic")
    refused = console.post("/api/cases/t-1/verdict", {"fraud": True})
    assert refused.status == 401
    assert console.get("/", {}).status == 303  # the page sends a stranger to /login
    wrong = basic((ANALYST[0], "not the password"))
    assert console.get("/api/cases", wrong).status == 401
    assert console.get("/api/cases", basic(("nobody", "x" * 12))).status == 401
    # Five failures in the window: the name is refused before its password is checked.
    for _ in range(3):
        assert console.get("/api/cases", wrong).status == 401
    throttled = console.get("/api/cases", basic(ANALYST))
    assert throttled.status == 429 and int(throttled.headers["retry-after"]) > 0
    assert console.get("/healthz").status == 200 and console.get("/metrics").status == 200


def test_a_verdict_becomes_one_label_with_its_reviewer(console_factory) -> None:
    console = console_factory().start()
    produce(console.transactions, [(b"k", encode(transaction("t-1", "card-a", 80.0)))])
    produce(console.decisions, [(b"k", encode(decision("t-1", "card-a", 0.4)))])
    assert len(console.wait_for_cases(1)) == 1
    started = time.monotonic()
    closed = console.verdict("t-1", True, "cardholder denies it")
    assert closed.status == 200 and closed.json()["result"] == "closed"
    (label,) = read_topic(console.labels, 1, timeout_s=10)
    assert time.monotonic() - started < 10
    assert label.key() == b"card-a"
    value = json.loads(label.value() or b"")
    assert value == {
        "transaction_id": "t-1", "card_id": "card-a", "fraud": True, "event_time": NOW_MS,
        "reported_at": value["reported_at"], "terminal_id": "T-t-1", "reviewer": ANALYST[0],
    }  # fmt: skip
    assert value["reported_at"] >= NOW_MS
    assert console.cases() == []
    # The same verdict again changes nothing; a different one is a lead's to give.
    assert console.verdict("t-1", True).json()["result"] == "unchanged"
    refused = console.verdict("t-1", False)
    assert refused.status == 403 and "lead" in refused.json()["error"]
    reversed_ = console.verdict("t-1", False, "it was the cardholder", user=LEAD)
    assert reversed_.json()["result"] == "reversed"
    labels = read_topic(console.labels, 2, timeout_s=10)
    assert [json.loads(m.value() or b"")["fraud"] for m in labels] == [True, False]
    assert json.loads(labels[1].value() or b"")["reviewer"] == LEAD[0]
    audit = console.case("t-1").json()["audit"]
    assert [(a["actor"], a["action"], a["before"], a["after"]["fraud"]) for a in audit] == [
        (ANALYST[0], "closed", None, True),
        (LEAD[0], "reversed", {"fraud": True, "note": "cardholder denies it",
                               "reviewer": ANALYST[0]}, False),
    ]  # fmt: skip
    assert console.verdict("t-unknown", True).status == 404
    assert console.metric('fraud_review_verdicts_total{action="closed",verdict="fraud"}') == 1


def test_a_session_needs_its_csrf_token_to_change_anything(console_factory) -> None:
    console = console_factory().start()
    produce(console.decisions, [(b"k", encode(decision("t-1", "card-a", 0.4)))])
    assert len(console.wait_for_cases(1)) == 1
    cookie, csrf = console.login(ANALYST)
    set_cookie = request(console.port, "POST", "/login", b"name=ana&password=analyst+password+1",
                         {"Content-Type": "application/x-www-form-urlencoded"})  # fmt: skip
    assert "HttpOnly" in set_cookie.headers["set-cookie"]
    assert "SameSite=Strict" in set_cookie.headers["set-cookie"]
    assert console.get("/api/cases", {"Cookie": cookie}).status == 200
    path = "/api/cases/t-1/verdict"
    body = {"fraud": True, "note": ""}
    assert console.post(path, body, {"Cookie": cookie}).status == 403
    assert console.post(path, body, {"Cookie": cookie, "X-CSRF-Token": "forged"}).status == 403
    assert console.cases() != []  # nothing was recorded
    # With the token, still only a JSON body from this origin.
    session = {"Cookie": cookie, "X-CSRF-Token": csrf}
    as_form = request(console.port, "POST", path, b'{"fraud": true}',
                      {**session, "Content-Type": "text/plain"})  # fmt: skip
    assert as_form.status == 415
    for foreign in ({"Sec-Fetch-Site": "cross-site"}, {"Origin": "https://evil.example"}):
        assert console.post(path, body, {**session, **foreign}).status == 403
    ok = console.post(path, body, {**session, "Origin": f"http://127.0.0.1:{console.port}"})
    assert ok.status == 200
    # Logging out needs the token too (no other site can log an analyst out), and ends the
    # session: the cookie opens nothing any more.
    headers = {"Cookie": cookie, "Content-Type": "application/x-www-form-urlencoded"}
    forced = request(console.port, "POST", "/logout", b"csrf=forged", headers)
    assert forced.status == 403
    assert console.get("/api/cases", {"Cookie": cookie}).status == 200
    form = urllib.parse.urlencode({"csrf": csrf}).encode()
    out = request(console.port, "POST", "/logout", form, headers)
    assert out.status == 303
    assert console.get("/api/cases", {"Cookie": cookie}).status == 401


def test_a_restart_keeps_cases_verdicts_and_the_join(console_factory) -> None:
    console = console_factory().start()
    produce(console.transactions, [(b"k", encode(transaction("t-1", "c", 10.0)))])
    produce(console.decisions, [(b"k", encode(decision("t-1", "c", 0.5))),
                                (b"k", encode(decision("t-2", "c", 0.6)))])  # fmt: skip
    assert len(console.wait_for_cases(2)) == 2
    assert console.verdict("t-1", True).status == 200
    assert console.stop() == 0
    # While it is down: t-2's transaction arrives, and the scorer re-decides t-1 (at least once).
    produce(console.transactions, [(b"k", encode(transaction("t-2", "c", 70.0)))])
    produce(console.decisions, [(b"k", encode(decision("t-1", "c", 0.5)))])
    console.start()
    deadline = time.monotonic() + 30
    while (cases := console.cases()) and cases[0]["amount"] is None:
        assert time.monotonic() < deadline, cases
        time.sleep(0.2)
    assert [(c["transaction_id"], c["amount"]) for c in cases] == [("t-2", 70.0)]
    (closed,) = console.cases("closed")
    assert (closed["transaction_id"], closed["fraud"], closed["reviewer"]) == ("t-1", True, "ana")
    assert len(read_topic(console.labels, 1, timeout_s=10)) == 1


def test_two_consoles_on_one_postgres_share_their_cases(
    admin: AdminClient, postgres_url: str, tmp_path: Path
) -> None:
    suffix = uuid.uuid4().hex[:10]
    names = (f"decisions-{suffix}", f"tx-{suffix}", f"labels-{suffix}")
    create_topics(admin, [NewTopic(name, 2, 1) for name in names])
    consoles = [
        ReviewConsole(*names, postgres_url, tmp_path / f"review-{i}.log", group="shared")
        for i in range(2)
    ]
    try:
        assert consoles[0].add_user(*ANALYST, "analyst").returncode == 0
        for console in consoles:
            console.start()
        # Keys spread the decisions over both partitions, so over both consoles' assignments.
        produce(names[0], [(f"k{i}".encode(), encode(decision(f"t-{i}", f"c-{i}", 0.1 * i + 0.1)))
                           for i in range(6)])  # fmt: skip
        for console in consoles:
            assert len(console.wait_for_cases(6)) == 6
        assert consoles[0].verdict("t-3", True).status == 200
        (closed,) = consoles[1].cases("closed")
        assert (closed["transaction_id"], closed["reviewer"]) == ("t-3", ANALYST[0])
        assert consoles[1].verdict("t-3", True).json()["result"] == "unchanged"
        assert len(read_topic(names[2], 1, timeout_s=10, settle_s=2)) == 1
    finally:
        for console in consoles:
            console.kill()
        delete_topics(admin, list(names))


def test_the_page_escapes_what_it_shows(console_factory) -> None:
    console = console_factory()
    # A name is each verdict's reviewer: the label contract's bound is the name's.
    too_long = console.add_user("x" * 65, "lead password 12", "analyst")
    assert too_long.returncode == 2 and "64" in too_long.stderr
    hostile = ('<script>alert("x")</script>', "lead password 12")
    assert console.add_user(*hostile, "analyst").returncode == 0
    console.start()
    cookie, _ = console.login(hostile)
    page = console.get("/", {"Cookie": cookie})
    assert b"<script>alert" not in page.body
    assert b"&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page.body
    assert "script-src" not in page.headers["content-security-policy"]  # 'self' only
    assert page.headers["x-frame-options"] == "DENY"


_hostile_text = st.text(
    alphabet=st.characters(codec="utf-8", categories=("L", "M", "N", "P", "S", "Z", "Cc")),
    max_size=3_000,
) | st.sampled_from(["<script>alert(1)</script>", '"><img src=x onerror=alert(1)>', "x" * 20_000])


@pytest.fixture(scope="module")
def hostile_console(admin: AdminClient, tmp_path_factory) -> Iterator[ReviewConsole]:
    tmp = tmp_path_factory.mktemp("hostile")
    suffix = uuid.uuid4().hex[:10]
    names = (f"decisions-{suffix}", f"tx-{suffix}", f"labels-{suffix}")
    create_topics(admin, [NewTopic(name, 1, 1) for name in names])
    console = ReviewConsole(*names, tmp / "review.db", tmp / "review.log")
    assert console.add_user(*ANALYST, "analyst").returncode == 0
    merchant = '<script>alert("merchant")</script>'
    produce(console.transactions, [(b"k", encode(transaction("t-1", "c", 5.0, merchant)))])
    produce(console.decisions, [(b"k", encode(decision("t-1", "c", 0.5)))])
    console.start()
    assert len(console.wait_for_cases(1)) == 1
    yield console
    console.kill()
    delete_topics(admin, names)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    transaction_id=_hostile_text,
    body=st.one_of(
        st.builds(lambda f, n: {"fraud": f, "note": n}, st.booleans(), _hostile_text),
        st.dictionaries(st.text(max_size=10), st.integers() | st.text(max_size=50), max_size=4),
        st.binary(max_size=2_000),
    ),
)
def test_hostile_api_input_is_refused_or_kept_as_text(
    hostile_console, transaction_id, body
) -> None:
    console = hostile_console
    quoted = urllib.parse.quote(transaction_id, safe="")
    for response in (
        console.get(f"/api/cases/{quoted}", basic(ANALYST)),
        console.post(f"/api/cases/{quoted}/verdict", body, basic(ANALYST)),
    ):
        # Never a server error: an unknown id is 404, a bad body 400 or 413, a reversal by an
        # analyst 403.
        assert response.status in (200, 400, 403, 404, 413), (response.status, response.body[:200])
        assert response.headers["content-type"] == "application/json"
        json.loads(response.body)
    case = console.case("t-1").json()
    # The merchant name is kept as the producer wrote it; the JSON carries it as text.
    assert case["merchant_id"] == '<script>alert("merchant")</script>'
    if case["note"] is not None:
        assert len(case["note"]) <= 2_000
