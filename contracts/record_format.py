"""The format number of the records the project writes to Kafka for itself and reads back
(`terminal-risk`, `card-frauds`, the worker's progress, its internal records and table values, the
rules topic), so that replicas of two releases can run side by side during an upgrade.

A record carries its format in the field `format_version`; one without it is of format 1, as
release 0.1.0 wrote them. A reader reads every format up to its own and refuses a newer one: a
newer release wrote it, and its fields may mean what this one does not know. So readers are
upgraded before writers (the scorer before the features worker), and writers rolled back first
(docs/contracts.md, "Record formats").
"""

from __future__ import annotations

#: The field that holds a record's format.
FORMAT_FIELD = "format_version"
#: The format of a record that does not say (release 0.1.0 wrote none).
FIRST_FORMAT = 1


def check_format(
    found: object, record: str, newest: int, readers: str = "the scorer's replicas"
) -> None:
    """ValueError unless `found` (a record's `format_version`) is a format this release reads:
    1 up to `newest`. `record` names the record in the message, `readers` who must be upgraded
    before its writers."""
    if not isinstance(found, int) or isinstance(found, bool) or found < FIRST_FORMAT:
        raise ValueError(f"{record} record has format_version {found!r}, not a format number")
    if found > newest:
        raise ValueError(
            f"{record} record of format {found}, newer than this release reads ({newest}): a "
            f"newer release wrote it; upgrade its readers ({readers}) before its writers"
        )
