"""The test tiers, as packages: a test module imports its helpers as `tests.…` (tests.support
above all) however pytest or mypy is started, and each conftest is imported once, by that name."""
