"""A payment team's field names, nested paths, time format and codes, mapped onto the transaction
contract (FRAUD_INPUT_MAPPING, a TOML file; examples in examples/).

```toml
time_format = "iso8601"          # of event_time: epoch_ms (default), epoch_s, epoch_us, iso8601
amount_scale = 0.01              # amount times this (minor units to major; default 1)

[fields]                         # contract field = dotted path in the decoded record
transaction_id = "id"
card_id = "payment.card.token"
amount = "payment.amount_minor"
event_time = "created_at"

[values.channel]                 # the team's codes (as text) to the contract's values
"81" = "ecom"
"05" = "pos"

[constants]                      # fields the team does not have
card_present = false
```

A contract field that is neither mapped nor a constant is read from the field of its own name,
so a mapping names only what differs. The mapped record is then validated by the contract as
any other (`contracts/transaction.py`): a record that lacks a mapped path, or whose time does not
parse, is invalid (dead letter `validate`, naming the path). ISO-8601 times must carry their
offset (`Z` or `+02:00`): a time without one is ambiguous, so invalid. The offset also sets
`utc_offset_minutes` (unless the mapping maps or fixes that field), so hour-of-day features read
the local time of a checkout stamped `2026-03-01T23:30:00-05:00`.

The file is checked when the service starts: unknown keys or contract fields, a field both
mapped and constant, a constant or code value that is not a string, number or boolean, a bad
scale or time format stop it with one line naming the key; and
`check_schema_fields` checks the paths against the fields a registry schema declares.

Whoever can write the file can make it anything, so what it may cost is bounded: a file larger
than MAX_MAPPING_BYTES is refused before it is parsed, TOML nested deeper than the parser can
follow is refused rather than crashing it, a path has at most MAX_PATH_SEGMENTS segments (each
record walks every path), and an error shows at most a few dozen characters of a value. Applied
to a record, a value the mapping cannot convert (a code that is not a scalar, a number too large
for the scale) makes the record invalid, never an error of another kind.
"""

from __future__ import annotations

import datetime as dt
import math
import reprlib
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from contracts.event_time import EpochMs
from contracts.transaction import Transaction
from plumbing.bounded_read import read_bounded
from plumbing.errors import ConfigurationError, ValidationError

CONTRACT_FIELDS: tuple[str, ...] = tuple(Transaction.__struct_fields__)
TIME_FORMATS = ("epoch_ms", "epoch_s", "epoch_us", "iso8601")
_TIME_UNIT_MS = {"epoch_ms": 1.0, "epoch_s": 1000.0, "epoch_us": 0.001}
_MISSING = object()
_TOP_LEVEL = ("time_format", "amount_scale")
#: Past any event time the contract takes in any unit (its bound is checked after conversion).
_MAX_EPOCH = 1e18
#: The largest mapping file read: thousands of value codes fit in a small part of it, and
#: parsing costs tens of bytes of memory per byte of the file.
MAX_MAPPING_BYTES = 256 * 1024
#: The most segments a mapped path may have: deeper than any schema's nesting, and every
#: record walks every path.
MAX_PATH_SEGMENTS = 32
#: How much of a value an error shows.
_SHOWN = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxother = 60
_SHOWN.maxlist = _SHOWN.maxdict = 4
_SHOWN.maxlevel = 2


@dataclass(frozen=True)
class FieldMapping:
    """How a team's decoded record becomes the contract's fields."""

    #: contract field → path (the keys from the record's top level down).
    paths: dict[str, tuple[str, ...]] = field(default_factory=dict)
    constants: dict[str, Any] = field(default_factory=dict)
    amount_scale: float = 1.0
    #: contract field → {the team's value, as text → the contract's value}
    values: dict[str, dict[str, Any]] = field(default_factory=dict)
    time_format: str = "epoch_ms"

    @classmethod
    def load(cls, path: Path) -> FieldMapping:
        """Read and check a mapping file; ConfigurationError naming what is wrong."""
        try:
            content = read_bounded(path, MAX_MAPPING_BYTES, f"input mapping {str(path)!r}")
            text = content.decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigurationError(f"cannot read input mapping {str(path)!r}: {exc}") from exc
        try:
            document = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigurationError(f"input mapping {str(path)!r} is not TOML: {exc}") from exc
        except RecursionError:
            raise ConfigurationError(
                f"input mapping {str(path)!r}: arrays or tables nested too deep to read"
            ) from None
        return cls.from_document(document, str(path))

    @classmethod
    def from_document(
        cls, document: Mapping[str, Any], name: str = "input mapping"
    ) -> FieldMapping:
        def fail(message: str) -> ConfigurationError:
            return ConfigurationError(f"{name}: {message}")

        unknown_keys = set(document) - {*_TOP_LEVEL, "fields", "values", "constants"}
        if unknown_keys:
            raise fail(f"unknown key {_shown(sorted(unknown_keys)[0])}; keys are time_format, "
                       "amount_scale, [fields], [values], [constants]")  # fmt: skip
        sections = {k: document.get(k, {}) for k in ("fields", "values", "constants")}
        for section, content in sections.items():
            if not isinstance(content, dict):
                raise fail(f"[{section}] must be a table")
            for contract_field in content:
                if contract_field not in CONTRACT_FIELDS:
                    raise fail(f"[{section}] names {_shown(contract_field)}, not a transaction "
                               f"field ({', '.join(CONTRACT_FIELDS)})")  # fmt: skip
        paths: dict[str, tuple[str, ...]] = {}
        for contract_field, dotted in sections["fields"].items():
            if not isinstance(dotted, str) or not all(dotted.split(".")):
                raise fail(f"[fields] {contract_field} must be a dotted path, got {_shown(dotted)}")
            path = tuple(dotted.split("."))
            if len(path) > MAX_PATH_SEGMENTS:
                raise fail(
                    f"[fields] {contract_field} has {len(path):,} segments, at most "
                    f"{MAX_PATH_SEGMENTS}"
                )
            paths[contract_field] = path
        both = set(paths) & set(sections["constants"])
        if both:
            raise fail(f"{sorted(both)[0]!r} is both mapped and a constant")
        scale = document.get("amount_scale", 1.0)
        if not _is_number(scale) or not scale > 0 or not math.isfinite(scale):
            raise fail(f"amount_scale must be a number > 0, got {_shown(scale)}")
        for contract_field, constant in sections["constants"].items():
            if not _is_scalar(constant):
                raise fail(f"[constants] {contract_field} must be a string, number or boolean")
        values: dict[str, dict[str, Any]] = {}
        for contract_field, table in sections["values"].items():
            if not isinstance(table, dict) or not table:
                raise fail(f"[values.{contract_field}] must be a table of code = value")
            for code, value in table.items():
                if not _is_scalar(value):
                    raise fail(
                        f"[values.{contract_field}] {_shown(code)} must map to a string, number "
                        "or boolean"
                    )
            values[contract_field] = dict(table)
        time_format = document.get("time_format", "epoch_ms")
        if time_format not in TIME_FORMATS:
            raise fail(
                f"time_format must be one of {', '.join(TIME_FORMATS)}, got {_shown(time_format)}"
            )
        if time_format == "iso8601" and "event_time" in sections["constants"]:
            # The time parsed from each record (with its UTC offset) is what iso8601 converts.
            raise fail(
                "time_format iso8601 reads each record's event_time: map it in [fields], not "
                "in [constants]"
            )
        return cls(paths, dict(sections["constants"]), float(scale), values, time_format)

    def apply(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """The contract's fields of one decoded record (to be validated by the contract).

        Raises ValidationError when a mapped path is missing, a code has no mapping, or a time
        does not parse."""
        out: dict[str, Any] = {}
        for contract_field in CONTRACT_FIELDS:
            if contract_field in self.constants:
                out[contract_field] = self.constants[contract_field]
                continue
            path = self.paths.get(contract_field, (contract_field,))
            value = _at(record, path)
            if value is _MISSING:
                if contract_field in self.paths:
                    raise ValidationError(f"mapped field {'.'.join(path)} is missing")
                continue  # the contract says whether it may be absent
            try:
                out[contract_field] = self._convert(contract_field, value)
            except (OverflowError, ValueError, RecursionError) as exc:
                # A number too large for the scale or for text: the record is invalid.
                raise ValidationError(f"{contract_field}: cannot convert {_shown(value)}") from exc
        if self.time_format == "iso8601" and "event_time" in out:
            out["event_time"], offset = out["event_time"]
            if not any(
                "utc_offset_minutes" in where for where in (out, self.paths, self.constants)
            ):
                out["utc_offset_minutes"] = offset
        return out

    def check_schema_fields(self, declared: Iterable[tuple[str, ...]]) -> None:
        """Raise ConfigurationError naming the first mapped path a schema does not declare
        (`declared`: every path of the schema, nested records included)."""
        known = set(declared)
        for contract_field, path in self.paths.items():
            if path not in known:
                raise ConfigurationError(
                    f"input mapping: {contract_field} = {'.'.join(path)!r}, but the input "
                    "schema has no such field"
                )
        for contract_field in CONTRACT_FIELDS:
            if contract_field in self.paths or contract_field in self.constants:
                continue
            if contract_field in _REQUIRED and (contract_field,) not in known:
                raise ConfigurationError(
                    f"input mapping: the input schema has no field {contract_field!r}: map it "
                    f"in [fields] or give it in [constants]"
                )

    def _convert(self, contract_field: str, value: Any) -> Any:
        codes = self.values.get(contract_field)
        if codes is not None:
            if not isinstance(value, str | int | float):
                raise ValidationError(f"{contract_field}: no mapping for the value {_shown(value)}")
            key = str(value).lower() if isinstance(value, bool) else str(value)
            if key not in codes:
                raise ValidationError(f"{contract_field}: no mapping for the value {_shown(value)}")
            value = codes[key]
        if contract_field == "amount" and self.amount_scale != 1.0 and _is_number(value):
            value = value * self.amount_scale
        if contract_field == "event_time" and self.time_format != "epoch_ms":
            value = self._event_time_ms(value)
        return value

    def _event_time_ms(self, value: Any) -> int | tuple[int, int | None]:
        """Epoch ms; for ISO-8601, (epoch ms, the time's offset from UTC in minutes)."""
        if isinstance(value, EpochMs):  # an instant of its own unit, with no local offset
            return (int(value), None) if self.time_format == "iso8601" else int(value)
        if self.time_format == "iso8601":
            if not isinstance(value, str):
                raise ValidationError(
                    f"event_time: expected an ISO-8601 string, got {_shown(value)}"
                )
            try:
                moment = dt.datetime.fromisoformat(value)
            except ValueError as exc:
                raise ValidationError(f"event_time: not ISO-8601: {_shown(value)}") from exc
            offset = moment.utcoffset()
            if offset is None:
                raise ValidationError(
                    f"event_time: {_shown(value)} has no offset (add Z or +hh:mm)"
                )
            return int(moment.timestamp() * 1000), round(offset.total_seconds() / 60)
        if not _is_number(value):
            raise ValidationError(
                f"event_time: expected a number ({self.time_format}), got {_shown(value)}"
            )
        if isinstance(value, int):  # exact, however large
            return value * 1000 if self.time_format == "epoch_s" else value // 1000
        if not math.isfinite(value) or abs(value) > _MAX_EPOCH:
            raise ValidationError(f"event_time: out of range: {_shown(value)}")
        return round(float(value) * _TIME_UNIT_MS[self.time_format])


#: Contract fields without a default: a schema must give them, or the mapping.
_REQUIRED = frozenset(f.name for f in msgspec.structs.fields(Transaction) if f.required)


def _at(record: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = record
    for key in path:
        if not isinstance(value, Mapping) or key not in value:
            return _MISSING
        value = value[key]
    return value


def _shown(value: Any) -> str:
    """`value` as an error shows it: its repr, cut short."""
    try:
        return _SHOWN.repr(value)
    except (ValueError, RecursionError):  # an integer too long for text, say
        return f"<{type(value).__name__}>"


def _is_scalar(value: Any) -> bool:
    """Whether `value` is of a kind a contract field holds (TOML also has tables, arrays and
    dates)."""
    return isinstance(value, str | int | float)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def avro_paths(
    schema: Mapping[str, Any] | str, prefix: tuple[str, ...] = ()
) -> list[tuple[str, ...]]:
    """Every field path an Avro record schema declares, nested records (and nullable ones)
    included."""
    paths: list[tuple[str, ...]] = []
    if not isinstance(schema, Mapping) or schema.get("type") != "record":
        return paths
    for avro_field in schema.get("fields", []):
        path = (*prefix, avro_field["name"])
        paths.append(path)
        kinds = avro_field["type"] if isinstance(avro_field["type"], list) else [avro_field["type"]]
        for kind in kinds:
            paths.extend(avro_paths(kind, path))
    return paths


def json_schema_paths(
    schema: Mapping[str, Any], prefix: tuple[str, ...] = ()
) -> list[tuple[str, ...]]:
    """Every property path a JSON Schema object declares, nested objects included."""
    paths: list[tuple[str, ...]] = []
    for name, sub in (schema.get("properties") or {}).items():
        path = (*prefix, name)
        paths.append(path)
        if isinstance(sub, Mapping):
            paths.extend(json_schema_paths(sub, path))
    return paths
