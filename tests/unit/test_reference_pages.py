"""The docs site's generated pages (ops/tools/reference_pages.py) match the code: every option
of the four long-running commands is on the configuration page with the environment variable and
default its `--help` states, and every metric is on the metrics page."""

from __future__ import annotations

import re

from ops.tools import reference_pages
from tests.deploy.repo import metric_families


def test_the_committed_pages_are_what_the_code_generates() -> None:
    assert reference_pages.stale_pages() == [], (
        "regenerate them: .venv/bin/python -m ops.tools.reference_pages"
    )


def test_every_option_of_the_configured_commands_is_on_the_configuration_page() -> None:
    page = reference_pages.configuration_page()
    parsers = dict(reference_pages._commands())
    for name in reference_pages.CONFIGURED:
        section = page.split(f"## `{name}`", 1)[1].split("\n## ", 1)[0]
        # --help wraps at hyphens too ("fraud-" / "scorer"): compare without whitespace.
        printed = parsers[name].format_help()
        help_text = "".join(printed.split())
        for flag in re.findall(r"^\| `(--[a-z0-9-]+)`", section, flags=re.M):
            assert flag in help_text, f"{name}: {flag} on the page, not in --help"
        for env, default in re.findall(r"\| `([A-Z0-9_]+)`[^|]* \| `([^`]*)` \|", section):
            assert f"[env{env}" in help_text, f"{name}: {env} on the page, not in --help"
            assert f"default:{''.join(default.split())}]" in help_text, (
                f"{name}: {env}'s default {default!r}"
            )
        option_lines = r"^  (?:-[A-Za-z], )?(--[a-z0-9-]+)"
        flags_in_help = set(re.findall(option_lines, printed, flags=re.M)) - {"--help"}
        on_page = set(re.findall(r"`(--[a-z0-9-]+)`", section))
        assert flags_in_help <= on_page, f"{name}: {flags_in_help - on_page} not on the page"


def test_every_metric_is_on_the_metrics_page() -> None:
    page = reference_pages.metrics_page()
    for name, (kind, labels) in metric_families().items():
        shown = name + "_total" if kind == "counter" else name
        row = next((line for line in page.splitlines() if line.startswith(f"| `{shown}` |")), None)
        assert row is not None, f"{shown} is not on the metrics page"
        assert all(f"`{label}`" in row for label in labels), f"{shown}: labels {labels}"
