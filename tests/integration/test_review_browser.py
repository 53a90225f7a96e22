"""The review console as an analyst uses it: Debian's Chromium (headless), driven by Selenium
through Debian's chromedriver, against the console on the real broker while the scorer decides
simulated traffic. Log in, see the queue by expected loss, open a case and its reasons, press
the fraud key, watch the case leave, find the label with its reviewer, log out.

The screenshots in docs/images/ were taken by this test:
`REVIEW_SCREENSHOTS=docs/images pytest tests/integration/test_review_browser.py`.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from tests.integration.conftest import fed_by_loadgen, read_topic, run_loadgen
from tests.integration.review_console import ANALYST, ReviewConsole
from tests.support.topics import create_topics, delete_topics

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
RATE, DURATION_S = 200, 15


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    for program in (CHROMIUM, CHROMEDRIVER):
        if shutil.which(program) is None:
            pytest.fail(
                f"{program} not found: apt-get install chromium chromium-driver (`make test` does)"
            )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    # As root, without a sandbox; no background connections, which this closed network refuses.
    for flag in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-dev-shm-usage", "--window-size=1400,900",
        f"--user-data-dir={tmp_path / 'chromium'}",
    ):  # fmt: skip
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def test_an_analyst_clears_a_case_with_the_fraud_key(
    admin: AdminClient, topics_factory, service_factory, browser: WebDriver, tmp_path: Path
) -> None:
    topics = topics_factory(partitions=2)
    labels = f"labels-{uuid.uuid4().hex[:10]}"
    create_topics(admin, [NewTopic(labels, 1, 1)])
    console = ReviewConsole(
        topics.output, topics.input, labels, tmp_path / "review.db", tmp_path / "review.log"
    )
    try:
        scorer = service_factory(topics, *fed_by_loadgen(RATE))
        scorer.wait_for_metric("fraud_records_consumed_total", 0)
        assert console.add_user(*ANALYST, "analyst").returncode == 0
        console.start()
        load = run_loadgen(
            topics, scorer.metrics_port, "--rate", str(RATE), "--duration", str(DURATION_S),
            "--no-labels",
        )  # fmt: skip
        assert load.returncode == 0, load.stderr
        flagged = console.wait_for_cases(3)
        assert len(flagged) >= 3, console.log()
        assert all(case["amount"] is not None for case in flagged)
        _analyst_session(browser, console, tmp_path)
    finally:
        console.kill()
        delete_topics(admin, [labels])


def _analyst_session(browser: WebDriver, console: ReviewConsole, tmp_path: Path) -> None:
    # The queue re-renders every poll: a row read while it is replaced is read again.
    wait = WebDriverWait(browser, 20, ignored_exceptions=[StaleElementReferenceException])
    base = f"http://127.0.0.1:{console.port}"
    shots = Path(os.environ.get("REVIEW_SCREENSHOTS", tmp_path))

    # Log in: the queue sends a stranger to the login page.
    browser.get(base + "/")
    assert browser.current_url == base + "/login"
    browser.find_element(By.ID, "name").send_keys(ANALYST[0])
    browser.find_element(By.ID, "password").send_keys(ANALYST[1])
    browser.find_element(By.ID, "login").click()
    wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, "#queue tbody tr")) >= 3)

    # The queue by expected loss, highest first, as the API has it.
    shown = _queue(browser)
    losses = [float(loss) for _, loss in shown]
    assert losses == sorted(losses, reverse=True)
    api_order = [case["transaction_id"] for case in console.cases()]
    assert [tid for tid, _ in shown] == api_order

    # The first case opens with its reasons.
    top = api_order[0]
    wait.until(lambda b: b.find_element(By.ID, "case-id").text == top)
    reasons = browser.execute_script(
        "return [...document.querySelectorAll('#case-reasons li')].map(li => li.textContent)"
    )
    assert reasons and all(reasons)
    # Each in its words (`text`), as the API has them.
    words = [reason["text"] for reason in console.case(top).json()["reasons"]]
    assert [item.rsplit(" (+", 1)[0] for item in reasons] == words
    browser.save_screenshot(str(shots / "review-case.png"))

    # The fraud key closes it: it leaves the queue, and its label is on the topic.
    browser.find_element(By.TAG_NAME, "body").send_keys("f")
    wait.until(
        lambda b: (
            top
            not in [
                row.get_attribute("data-transaction-id")
                for row in b.find_elements(By.CSS_SELECTOR, "#queue tbody tr")
            ]
        )
    )
    started = time.monotonic()
    (label,) = read_topic(console.labels, 1, timeout_s=10)
    assert time.monotonic() - started < 10
    value = json.loads(label.value() or b"")
    assert (value["transaction_id"], value["fraud"], value["reviewer"]) == (top, True, ANALYST[0])
    browser.save_screenshot(str(shots / "review-queue.png"))

    # Log out: the queue is refused from then on.
    browser.find_element(By.ID, "logout").click()
    wait.until(lambda b: b.current_url == base + "/login")
    wait.until(lambda b: b.execute_script("return document.readyState") == "complete")
    assert browser.find_elements(By.ID, "login")
    status = browser.execute_script(
        "return fetch('/api/cases', {credentials: 'same-origin'}).then(r => r.status)"
    )
    assert status == 401


def _queue(browser: WebDriver) -> list[tuple[str, str]]:
    """The queue's rows as shown: (transaction id, expected loss), read in one script (the page
    redraws the rows every few seconds, so element handles would go stale)."""
    rows = browser.execute_script(
        "return [...document.querySelectorAll('#queue tbody tr')]"
        ".map(tr => [tr.dataset.transactionId, tr.cells[0].textContent])"
    )
    return [(str(tid), str(loss)) for tid, loss in rows]
