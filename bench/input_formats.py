"""Decoding cost per input format (FRAUD_INPUT_FORMAT), and encoding cost per decision format
(FRAUD_OUTPUT_FORMAT), side by side, on the same records.

    python -m bench.input_formats [--records 20000] [--rounds 5] [--registry URL]

The same simulated transactions are written once per format (the contract's JSON; Avro, JSON
Schema and Protobuf with Confluent's serializers against a real Schema Registry,
`make registry-up`; JSON in
the checkout example's own shape, read through its field mapping), then
each format's decoder (`contracts.input_formats.transaction_decoder`, what the consuming loop
calls per record, validation included) reads them all. Formats take turns within each round,
so a noisy neighbour slows all of them alike; the figure per format is the median of the
rounds, with their range. The schema lookup is cached after the first record, as in the
service. The decisions of those records (a score, a decision, and reasons on every fifth) are
then encoded by each output format's encoder (`contracts.output_formats.decision_encoder`) the
same way. One JSON line; also written to bench/results/input-formats.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import msgspec
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from bench.harness import REPO
from bench.payment_pb2 import Payment
from contracts.decision import Decision, Reason
from contracts.field_mapping import FieldMapping
from contracts.input_formats import INPUT_FORMATS, transaction_decoder
from contracts.output_formats import OUTPUT_FORMATS, decision_encoder, topic_subject
from simulator.team_shapes import checkout_event
from simulator.transactions import TransactionSimulator

RESULTS = REPO / "bench" / "results" / "input-formats.json"
DEFAULT_REGISTRY = "http://127.0.0.1:18081/apis/ccompat/v7"
TOPIC = "bench-input-formats"
PROTOBUF_MESSAGE = "bench.payment_pb2:Payment"

_AVRO_TYPES = {str: "string", float: "double", int: "long", bool: "boolean"}
_JSON_TYPES = {str: "string", float: "number", int: "integer", bool: "boolean"}


def _schemas(record: dict[str, Any]) -> tuple[str, str]:
    """An Avro and a JSON Schema for the simulator's records (every field as it comes)."""
    avro = {
        "type": "record",
        "name": "BenchTransaction",
        "fields": [{"name": k, "type": _AVRO_TYPES[type(v)]} for k, v in record.items()],
    }
    json_schema = {
        "type": "object",
        "properties": {k: {"type": _JSON_TYPES[type(v)]} for k, v in record.items()},
        "required": list(record),
    }
    return json.dumps(avro), json.dumps(json_schema)


def encoded(
    records: list[dict[str, Any]], registry: SchemaRegistryClient
) -> dict[str, list[bytes]]:
    """The records in every format."""
    avro_schema, json_schema = _schemas(records[0])
    context = SerializationContext(TOPIC, MessageField.VALUE)
    serializers: dict[str, Callable[[Any, SerializationContext], bytes | None]] = {
        "avro": AvroSerializer(registry, avro_schema, conf=topic_subject()),
        "json-schema": JSONSerializer(json_schema, registry, conf=topic_subject()),
        "protobuf": _protobuf(registry),
    }
    out = {"json": [msgspec.json.encode(r) for r in records]}
    for name, serialize in serializers.items():
        out[name] = [value for r in records if (value := serialize(r, context)) is not None]
    return out


def _protobuf(
    registry: SchemaRegistryClient,
) -> Callable[[Any, SerializationContext], bytes | None]:
    serialize = ProtobufSerializer(
        Payment, registry, {"use.deprecated.format": False, **topic_subject()}
    )
    return lambda record, context: serialize(Payment(**record), context)


def run(records: int, rounds: int, registry_url: str) -> dict[str, Any]:
    simulated = [dict(r) for r in TransactionSimulator(5).generate(records).records]
    # Every record with the same fields (the terminal id is optional in the contract).
    simulated = [r for r in simulated if r.get("terminal_id")]
    with SchemaRegistryClient({"url": registry_url}) as registry:
        values = encoded(simulated, registry)
    decoders = {
        name: transaction_decoder(
            name, TOPIC, {"url": registry_url}, protobuf_message=PROTOBUF_MESSAGE
        )
        for name in INPUT_FORMATS
    }
    # JSON in a team's own shape through a field mapping (examples/checkout).
    values["json, mapped"] = [msgspec.json.encode(checkout_event(r)) for r in simulated]
    decoders["json, mapped"] = transaction_decoder(
        "json", TOPIC, mapping=FieldMapping.load(REPO / "examples" / "checkout" / "mapping.toml")
    )
    decisions = [_decision(r, i) for i, r in enumerate(simulated)]
    encoders = {
        name: decision_encoder(name, f"{TOPIC}-decisions-{name}", {"url": registry_url})
        for name in OUTPUT_FORMATS
    }
    rates: dict[str, list[float]] = {name: [] for name in decoders}
    encode_rates: dict[str, list[float]] = {name: [] for name in encoders}
    for _ in range(rounds):
        for name, decode in decoders.items():
            rates[name].append(_rate(decode, values[name]))
        for name, encode in encoders.items():
            encode_rates[name].append(_rate(encode, decisions))
    return {
        "records": len(simulated),
        "rounds": rounds,
        "records_per_s": _summary(rates),
        "decisions_encoded_per_s": _summary(encode_rates),
    }


def _decision(record: dict[str, Any], i: int) -> Decision:
    flagged = i % 5 == 0
    return Decision(
        str(record["transaction_id"]),
        str(record["card_id"]),
        0.9 if flagged else 0.01,
        "review" if flagged else "approve",
        "bench",
        False,
        int(record["event_time"]),
        int(record["event_time"]) + 12,
        reasons=(Reason(feature="log_amount", text="amount 120.00", contribution=0.3),) * 3
        if flagged
        else (),
    )


def _rate(call: Callable[[Any], Any], items: list[Any]) -> float:
    started = time.perf_counter()
    for item in items:
        call(item)
    return len(items) / (time.perf_counter() - started)


def _summary(rates: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """Median and range per format, and the median against JSON's."""
    return {
        name: {
            "median": round(statistics.median(r)),
            "min": round(min(r)),
            "max": round(max(r)),
            "vs_json": round(statistics.median(r) / statistics.median(rates["json"]), 3),
        }
        for name, r in rates.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=20_000, help="records per format")
    parser.add_argument("--rounds", type=int, default=5, help="rounds, formats in turn")
    parser.add_argument("--registry", default=DEFAULT_REGISTRY, help="Schema Registry URL")
    args = parser.parse_args()
    if args.records < 1 or args.rounds < 1:
        parser.error("--records and --rounds must be >= 1")
    result = run(args.records, args.rounds, args.registry)
    line = json.dumps(result)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
