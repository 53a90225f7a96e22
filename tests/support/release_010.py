"""What release 0.1.0 (commit cc13c04) wrote, for the tests that check this release reads it."""

from __future__ import annotations

import json

from contracts.output_formats import DECISION_AVRO_SCHEMA


def release_010_avro() -> str:
    """0.1.0's Avro decision schema: this release's, with 0.1.0's reason record (its words under
    `label` only)."""
    schema = json.loads(DECISION_AVRO_SCHEMA)
    (reasons,) = (field for field in schema["fields"] if field["name"] == "reasons")
    reasons["type"]["items"]["fields"] = [
        {"name": "feature", "type": "string"},
        {"name": "label", "type": "string"},
        {"name": "contribution", "type": "double"},
    ]
    return json.dumps(schema)
