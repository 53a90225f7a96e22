"""Which writer schemas a topic's registry records may be decoded with: each schema id checked
once, before its first record is decoded (docs/threat-model.md, "Transactions").

A registry record names its writer's schema by id, and it may name any id the registry holds,
not only the topic's. The decoder then does what that schema says, so a schema chosen by an
attacker decides what one record costs: an Avro array of `null` costs nothing per item on the
wire, and 12 bytes claiming 2^40 items grew a replica by gigabytes. `WriterSchemas.check` lets a
schema id through only when:

- it is registered under one of the allowed subjects (FRAUD_SCHEMA_REGISTRY_SUBJECTS; by
  default the topic's own `<topic>-value`), so only the topic's owners choose the schemas;
- its text is at most `MAX_SCHEMA_CHARS` long and nests at most `MAX_SCHEMA_DEPTH` deep;
- for Avro: the top level is a record, no named type contains itself (a recursive type nests
  as deep as the record is long, on the C decoder's stack), and no array or map item can be
  written in 0 bytes.

With the last rule, every item a record decodes into costs at least one byte of the record, so
a record of at most FRAUD_MAX_RECORD_BYTES decodes into at most that many items (JSON and
Protobuf hold this by their own wire formats: an item is at least a byte there too). A schema
that fails a check fails every record that names it (dead letter `schema_decode`); the verdict
is cached, for at most `MAX_CACHED_IDS` ids, so the registry is asked once per id.

It also finds, once per schema, where an Avro record may carry a logical type (`logical_paths`):
the decoder converts those values to the contract's plain ones (`plain_logical_values`).
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import uuid
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, MutableMapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from contracts.event_time import EpochMs
from plumbing.errors import (
    RegistryUnavailableError,
    SchemaDecodeError,
    SchemaUnknownError,
    ValidationError,
)

#: Far above any payment schema (the worked examples are under 3,000 characters).
MAX_SCHEMA_CHARS = 262_144
#: Far deeper than any payment record nests, far shallower than Python's or a C stack's limit.
MAX_SCHEMA_DEPTH = 32
#: Schemas one schema may refer to (Avro named types of other subjects), transitively.
MAX_REFERENCES = 64
#: Schema ids whose verdict is kept; past it the oldest is forgotten (and asked for again).
MAX_CACHED_IDS = 1_024
#: The registry's own code for "no such schema id" (Confluent's API). Any other 404 (a wrong URL
#: path, a misrouted ingress) is the registry's fault, not the record's: it holds the partition
#: like any other registry fault.
SCHEMA_NOT_FOUND = 40403
#: Its codes for "no such subject" and "no such version": a schema that refers to one is broken
#: for good, not the registry.
REFERENCE_NOT_FOUND = frozenset({40401, 40402})
#: HTTP answers from the registry that may pass (its error codes in Confluent's API).
TRANSIENT_STATUS = frozenset({401, 403, 404, 408, 429})

_PRIMITIVE_MIN_BYTES = {
    "null": 0,
    "boolean": 1,
    "int": 1,
    "long": 1,
    "float": 4,
    "double": 8,
    "bytes": 1,
    "string": 1,
}
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_ONE_MS = dt.timedelta(milliseconds=1)

Path = tuple[str, ...]


@dataclass(frozen=True)
class WriterSchema:
    """A writer schema let through, and where its records may carry Avro logical types."""

    schema_id: int
    logical_paths: tuple[Path, ...] = ()


def registry_failure(exc: Any, what: str) -> Exception:
    """A `SchemaRegistryError` sorted by cause: the registry's own "not found" is the record's
    fault (SchemaUnknownError); what may pass (down, overloaded, credentials refused, any other
    404) holds the partition (RegistryUnavailableError); anything else is SchemaDecodeError."""
    status = exc.http_status_code
    if status == 404 and exc.error_code == SCHEMA_NOT_FOUND:
        return SchemaUnknownError(f"{what}: {exc}")
    if status in TRANSIENT_STATUS or status >= 500 or status < 0:
        return RegistryUnavailableError(f"schema registry ({what}): {exc}")
    return SchemaDecodeError(f"schema registry refused the lookup ({what}): {exc}")


class WriterSchemas:
    """The verdict on each schema id a topic's records name, asked of the registry once."""

    def __init__(
        self,
        client: Any,
        subjects: Collection[str],
        schema_type: str,
        http_errors: Callable[[], type[BaseException]],
    ) -> None:
        """`client`: the registry client; `subjects`: those a schema must be registered under
        (one is enough); `schema_type`: AVRO, JSON or PROTOBUF; `http_errors`: the client's
        transport errors (a registry that cannot be reached)."""
        if not subjects:
            raise ValueError("at least one allowed subject is needed")
        self._client = client
        self._subjects = frozenset(subjects)
        self._schema_type = schema_type
        self._http_errors = http_errors
        self._verdicts: OrderedDict[int, WriterSchema | SchemaDecodeError] = OrderedDict()

    def check(self, schema_id: int) -> WriterSchema:
        """The schema `schema_id` when records may be decoded with it.

        Raises SchemaDecodeError (refused: not the topic's, or a shape that allocates without
        bound), SchemaUnknownError (the registry does not know the id), or
        RegistryUnavailableError (the registry cannot answer now; not cached)."""
        verdict = self._verdicts.get(schema_id)
        if verdict is None:
            try:
                verdict = self._judge(schema_id)
            except SchemaDecodeError as exc:
                verdict = exc
            self._verdicts[schema_id] = verdict
            if len(self._verdicts) > MAX_CACHED_IDS:
                self._verdicts.popitem(last=False)
        if isinstance(verdict, SchemaDecodeError):
            raise SchemaDecodeError(str(verdict))
        return verdict

    def _judge(self, schema_id: int) -> WriterSchema:
        subjects = self._ask(lambda: self._client.get_subjects_by_schema_id(schema_id), schema_id)
        if not self._subjects.intersection(subjects):
            raise SchemaDecodeError(
                f"schema id {schema_id} is registered under {sorted(subjects)[:5]}, not under "
                f"{sorted(self._subjects)} (FRAUD_SCHEMA_REGISTRY_SUBJECTS)"
            )
        schema = self._ask(lambda: self._client.get_schema(schema_id), schema_id)
        kind = schema.schema_type or "AVRO"
        if kind != self._schema_type:
            raise SchemaDecodeError(f"schema id {schema_id} is {kind}, not {self._schema_type}")
        if self._schema_type == "PROTOBUF":
            return WriterSchema(schema_id)  # read with the team's own class (input_formats)
        documents = [*self._referenced(schema, schema_id), _document(schema, schema_id)]
        if self._schema_type != "AVRO":
            return WriterSchema(schema_id)
        walk = _AvroWalk(schema_id)
        for named in documents[:-1]:  # the referenced types first, as the decoder reads them
            walk.min_bytes(named, None, 0)
        return WriterSchema(schema_id, walk.top_level(documents[-1]))

    def _referenced(self, schema: Any, schema_id: int) -> list[Any]:
        """The documents of the schemas `schema` refers to (Avro's named types of other
        subjects), each before what refers to it; at most MAX_REFERENCES in all."""
        documents: list[Any] = []
        pending = list(schema.references or [])
        seen: set[tuple[str, int]] = set()
        while pending:
            reference = pending.pop()
            key = (reference.subject, reference.version)
            if key in seen:
                continue
            seen.add(key)
            if len(seen) > MAX_REFERENCES:
                raise SchemaDecodeError(
                    f"schema id {schema_id} refers to more than {MAX_REFERENCES} schemas"
                )
            registered = self._reference(reference, schema_id)
            documents.insert(0, _document(registered.schema, schema_id))
            pending.extend(registered.schema.references or [])
        return documents

    def _reference(self, reference: Any, schema_id: int) -> Any:
        """The registered schema a reference names; SchemaDecodeError when the registry says it
        has no such subject or version (the writer's schema is broken for good)."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            return self._ask(
                partial(self._client.get_version, reference.subject, reference.version), schema_id
            )
        except (SchemaUnknownError, RegistryUnavailableError) as exc:
            cause = exc.__cause__
            if isinstance(cause, SchemaRegistryError) and cause.error_code in REFERENCE_NOT_FOUND:
                raise SchemaDecodeError(f"schema id {schema_id}: a reference: {cause}") from exc
            raise

    def _ask(self, lookup: Callable[[], Any], schema_id: int) -> Any:
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            return lookup()
        except SchemaRegistryError as exc:
            raise registry_failure(exc, f"schema id {schema_id}") from exc
        except (OSError, self._http_errors()) as exc:
            raise RegistryUnavailableError(
                f"schema registry unreachable: {type(exc).__name__}: {exc}"
            ) from exc


def _document(schema: Any, schema_id: int) -> Any:
    """A schema's text as JSON, within MAX_SCHEMA_CHARS and MAX_SCHEMA_DEPTH."""
    text = schema.schema_str or ""
    if len(text) > MAX_SCHEMA_CHARS:
        raise SchemaDecodeError(
            f"schema id {schema_id} is {len(text):,} characters, over {MAX_SCHEMA_CHARS:,}"
        )
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise SchemaDecodeError(f"schema id {schema_id} is not JSON: {exc}") from exc
    _check_depth(document, schema_id)
    return document


def _check_depth(document: Any, schema_id: int) -> None:
    """SchemaDecodeError when the schema's JSON nests deeper than MAX_SCHEMA_DEPTH."""
    level: list[Any] = [document]
    for _ in range(MAX_SCHEMA_DEPTH):
        level = [
            child
            for node in level
            for child in (node.values() if isinstance(node, dict) else node)
            if isinstance(child, dict | list)
        ]
        if not level:
            return
    raise SchemaDecodeError(f"schema id {schema_id} nests deeper than {MAX_SCHEMA_DEPTH}")


def avro_logical_paths(schema: Any, schema_id: int = 0) -> tuple[Path, ...]:
    """Check an Avro writer schema (SchemaDecodeError naming the rule it breaks) and return
    the record-field paths, through nested and nullable records, that carry a logical type."""
    return _AvroWalk(schema_id).top_level(schema)


class _AvroWalk:
    """One pass over an Avro schema: each type's fewest bytes on the wire, the named types,
    and the paths of logical types."""

    def __init__(self, schema_id: int) -> None:
        self._schema_id = schema_id
        #: Named types by full and short name: their fewest bytes, None while being defined.
        self._named: dict[str, int | None] = {}
        self.logical_paths: list[Path] = []

    def top_level(self, schema: Any) -> tuple[Path, ...]:
        """Check the writer's schema, a record; the paths of its logical types."""
        if not (isinstance(schema, dict) and schema.get("type") == "record"):
            raise self.refuse("the top level is not an Avro record")
        self.min_bytes(schema, (), 0)
        return tuple(dict.fromkeys(self.logical_paths))

    def refuse(self, why: str) -> SchemaDecodeError:
        return SchemaDecodeError(f"schema id {self._schema_id}: {why}")

    def min_bytes(self, schema: Any, path: Path | None, depth: int) -> int:
        """The fewest bytes a value of `schema` takes; `path`: where a record field of it sits
        (None inside an array or map, where logical types are not the contract's)."""
        if depth > MAX_SCHEMA_DEPTH:
            raise self.refuse(f"nests deeper than {MAX_SCHEMA_DEPTH}")
        if isinstance(schema, str):
            return self._reference(schema)
        if isinstance(schema, list):  # a union: its branch index, at least one byte
            for branch in schema:
                self.min_bytes(branch, path, depth + 1)
            return 1
        if not isinstance(schema, dict):
            raise self.refuse(f"not an Avro type: {str(schema)[:80]!r}")
        kind = schema.get("type")
        if "logicalType" in schema and path is not None:
            self.logical_paths.append(path)
        if kind == "record":
            return self._record(schema, path, depth)
        if kind == "array":
            return self._items(schema.get("items"), "array", 0, depth)
        if kind == "map":  # each entry also has its key: a string, at least one byte
            return self._items(schema.get("values"), "map", 1, depth)
        if kind in ("enum", "fixed"):
            size = 1 if kind == "enum" else schema.get("size")
            if not isinstance(size, int) or size < 0:
                raise self.refuse(f"fixed {schema.get('name')!r} has no valid size")
            self._define(schema, size)
            return size
        return self.min_bytes(kind, path, depth + 1)  # {"type": "long", ...} and the like

    def _record(self, schema: dict[str, Any], path: Path | None, depth: int) -> int:
        names = self._names(schema)
        for name in names:
            self._named[name] = None  # being defined: a reference to it now is recursion
        total = 0
        for field in schema.get("fields") or []:
            if not isinstance(field, dict) or not isinstance(field.get("name"), str):
                raise self.refuse(f"a field of {schema.get('name')!r} has no name")
            inner = None if path is None else (*path, field["name"])
            total += self.min_bytes(field.get("type"), inner, depth + 1)
        for name in names:
            self._named[name] = total
        return total

    def _items(self, items: Any, kind: str, overhead: int, depth: int) -> int:
        if overhead + self.min_bytes(items, None, depth + 1) == 0:
            raise self.refuse(
                f"an {kind} whose items can be written in 0 bytes: a record could claim "
                "any number of them"
            )
        return 1  # an empty one: its count, 0

    def _reference(self, name: str) -> int:
        if name in _PRIMITIVE_MIN_BYTES:
            return _PRIMITIVE_MIN_BYTES[name]
        if name not in self._named:
            raise self.refuse(f"unknown type {name[:80]!r}")
        size = self._named[name]
        if size is None:
            raise self.refuse(f"type {name[:80]!r} contains itself (a recursive schema)")
        return size

    def _define(self, schema: dict[str, Any], size: int) -> None:
        for name in self._names(schema):
            self._named[name] = size

    def _names(self, schema: dict[str, Any]) -> list[str]:
        name = schema.get("name")
        if not isinstance(name, str):
            raise self.refuse(f"a {schema.get('type')} without a name")
        namespace = schema.get("namespace")
        short = name.rsplit(".", 1)[-1]
        names = [name, short]
        if isinstance(namespace, str) and namespace and "." not in name:
            names.append(f"{namespace}.{name}")
        return names


def plain_logical_values(record: MutableMapping[str, Any], paths: tuple[Path, ...]) -> None:
    """Replace, in place, the logical-type values at `paths` by the contract's plain values:
    an Avro timestamp by its epoch milliseconds (`EpochMs`; a micros one truncated to the
    millisecond), a decimal by its float, a uuid by its text. A local timestamp has no zone,
    so no instant: ValidationError. Other values are left to the contract to judge."""
    for path in paths:
        parent = _parent(record, path)
        if parent is not None:
            value = parent[path[-1]]
            if isinstance(value, dt.datetime):
                if value.tzinfo is None:
                    raise ValidationError(
                        f"{'.'.join(path)}: a local timestamp has no zone, so no instant; "
                        "write timestamp-millis or timestamp-micros"
                    )
                parent[path[-1]] = EpochMs((value - _EPOCH) // _ONE_MS)
            elif isinstance(value, decimal.Decimal):
                parent[path[-1]] = float(value)
            elif isinstance(value, uuid.UUID):
                parent[path[-1]] = str(value)


def _parent(record: Mapping[str, Any], path: Path) -> MutableMapping[str, Any] | None:
    """The dict holding the value at `path`, when the record has one there."""
    node: Any = record
    for key in path[:-1]:
        node = node.get(key) if isinstance(node, Mapping) else None
    return node if isinstance(node, MutableMapping) and path[-1] in node else None
