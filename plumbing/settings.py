"""Settings declared once for every command: the declaration, the flags and environment
variables made from it, the conversion of their text, and errors that name the setting.

A setting is a field of a `Settings` struct (msgspec), declared as
`name: Annotated[type, meta(env, help, **bounds)] = default`. From these declarations alone
come a command's flags and their `--help` (`add_arguments`), the values from flags and
environment (`from_sources`: a flag wins over its variable, which wins over the default; an empty
value is not set), the checks of a value built in code (`__post_init__`), and the configuration
reference page (`ops/tools/reference_pages.py`). Each field is converted on its own against its
declared type, so an error knows its setting without reading msgspec's message.

The bases hold what the commands share: `KafkaSettings` (bootstrap servers, the extra librdkafka
settings and their properties file: every command) and `ServiceSettings` (instance id, log level
and format: the long-running services, `fraud-scorer` and `fraud-features`).

msgspec rather than pydantic-settings: every contract of the project is a msgspec struct already,
its `Meta` carries the bounds, help and environment name in one declaration, and the few pieces
pydantic-settings would add (flags, help, error wording) are the ones this module needs in the
project's own words: `-X KEY=VALUE` lists, secret-safe errors, `[env …; default: …]` help.
"""

from __future__ import annotations

import argparse
import functools
import os
import socket
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple, Self, Union, get_args, get_origin

import msgspec

from plumbing.errors import ConfigurationError
from plumbing.kafka_settings import (
    CONFIG_FILE_ENV,
    OPTIONS_ENV,
    parse_kafka_options,
    read_kafka_config_file,
    redact,
    redact_urls,
    split_kafka_options,
)

#: What a Kafka topic name (and a name built into one, such as an app id) may hold.
NAME_PATTERN = r"^[A-Za-z0-9._-]+$"
Topic = Annotated[str, msgspec.Meta(min_length=1, max_length=249, pattern=NAME_PATTERN)]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
LogFormat = Literal["text", "json"]


def meta(env: str, help: str, *, shown_default: str | None = None, **bounds: Any) -> msgspec.Meta:
    """The declaration of a setting: its environment variable, its help, its bounds, and how
    `--help` shows a default computed at start (`shown_default`, e.g. "<host>-<pid>")."""
    extra = {"env": env} if shown_default is None else {"env": env, "default": shown_default}
    return msgspec.Meta(description=help, extra=extra, **bounds)


class Setting(NamedTuple):
    """One declared setting, as `--help`, the reference page and the deploy checks show it."""

    name: str
    env: str
    help: str
    #: The documented default, as text.
    default: str
    #: Its flags: `--name-with-dashes`, or `-X`, `--kafka-option` for the librdkafka settings.
    flags: tuple[str, ...]


class Settings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A command's settings. Built in code, every value is checked against its declaration: a
    wrong type raises TypeError, a value out of bounds ValueError, naming the setting."""

    def __post_init__(self) -> None:
        for name, kind in _types(type(self)).items():
            value = getattr(self, name)
            try:
                msgspec.convert(value, kind, strict=True, dec_hook=_path_given)
            except msgspec.ValidationError:
                error = TypeError if not _of_type(value, kind) else ValueError
                raise error(_refusal(name, kind, value)) from None

    @classmethod
    def settings(cls) -> tuple[Setting, ...]:
        """Every setting, in declaration order (the shared ones first)."""
        return _declared(cls)

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
        """A flag for every setting, its help ending in `[env NAME; default: VALUE]`."""
        for setting in cls.settings():
            help_text = f"{setting.help} [env {setting.env}; default: {setting.default}]"
            repeated = _is_options(_types(cls)[setting.name])
            parser.add_argument(
                *setting.flags,
                dest=setting.name,
                action="append" if repeated else "store",
                metavar="KEY=VALUE" if repeated else setting.name.upper(),
                help=help_text.replace("%", "%%"),
            )

    @classmethod
    def from_args(cls, args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Self:
        """The settings from parsed flags (`add_arguments`), then the environment."""
        return cls.from_sources({s.name: getattr(args, s.name) for s in cls.settings()}, environ)

    @classmethod
    def from_sources(
        cls, flags: Mapping[str, Any], environ: Mapping[str, str] | None = None
    ) -> Self:
        """The settings from flags (name → text; None or empty: not given), then the
        environment (`os.environ` by default), then the defaults.

        Raises ConfigurationError naming the setting, where its value came from, what it
        accepts and the value (never a librdkafka setting's value: it may be a secret).
        """
        environ = os.environ if environ is None else environ
        types = _types(cls)
        values: dict[str, Any] = {}
        for setting in cls.settings():
            given = flags.get(setting.name)
            if given is not None and given != "":
                where = f"{' / '.join(setting.flags)} ({setting.env})"
            elif environ.get(setting.env):
                given, where = environ[setting.env], setting.env
            else:
                continue
            values[setting.name] = _converted(setting.name, types[setting.name], given, where)
        try:
            return cls(**values)
        except (TypeError, ValueError) as exc:  # a rule between several settings
            raise ConfigurationError(str(exc)) from None


class KafkaSettings(Settings, frozen=True, kw_only=True):
    """What every command that talks to Kafka reads: the brokers and the extra librdkafka
    settings (`plumbing/kafka_settings.py`), secrets in the properties file."""

    bootstrap_servers: Annotated[
        str,
        meta(
            "KAFKA_BOOTSTRAP_SERVERS",
            "Kafka bootstrap servers, host:port[,host:port]",
            min_length=1,
        ),
    ] = "127.0.0.1:9092"
    kafka_options: Annotated[
        dict[str, str],
        meta(
            OPTIONS_ENV,
            "extra librdkafka settings for every client, KEY=VALUE (repeat the flag; in the "
            "environment, comma-separated), e.g. security.protocol=SASL_SSL; put secrets in "
            "the config file instead: flags show in the process list",
        ),
    ] = msgspec.field(default_factory=dict)
    kafka_config_file: Annotated[
        Path | None,
        meta(
            CONFIG_FILE_ENV,
            "librdkafka settings from a properties file (key=value lines, # comments), e.g. "
            "mounted from a secret; -X and FRAUD_KAFKA_OPTIONS override its keys",
        ),
    ] = None

    def kafka_file_settings(self) -> dict[str, str]:
        """The librdkafka settings of the properties file (none without one).

        Raises ConfigurationError when the file cannot be read or parsed."""
        if self.kafka_config_file is None:
            return {}
        return read_kafka_config_file(self.kafka_config_file)

    def kafka_settings(self) -> dict[str, str]:
        """The librdkafka settings beyond the bootstrap servers: the properties file's, with
        kafka_options over them. Raises ConfigurationError when the file cannot be read."""
        return {**self.kafka_file_settings(), **self.kafka_options}

    def redacted_kafka_settings(self) -> dict[str, object]:
        """`kafka_settings()` as they may be logged (secrets masked)."""
        return redact(self.kafka_settings())


def _default_instance_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class ServiceSettings(KafkaSettings, frozen=True, kw_only=True):
    """What the long-running services add: the replica's name and its logs."""

    instance_id: Annotated[
        str,
        meta(
            "FRAUD_INSTANCE_ID",
            "name of this replica in logs and dead-letter headers",
            shown_default="<host>-<pid>",
            min_length=1,
        ),
    ] = msgspec.field(default_factory=_default_instance_id)
    log_level: Annotated[
        LogLevel, meta("FRAUD_LOG_LEVEL", "log level: DEBUG, INFO, WARNING or ERROR")
    ] = "INFO"
    log_format: Annotated[LogFormat, meta("FRAUD_LOG_FORMAT", "log format: text or json lines")] = (
        "text"
    )


@functools.cache
def _types(struct: type[Settings]) -> dict[str, Any]:
    """Each field's declared type, with its bounds (`Annotated`)."""
    return {field.name: field.type for field in msgspec.structs.fields(struct)}


@functools.cache
def _declared(struct: type[Settings]) -> tuple[Setting, ...]:
    declared = []
    for field in msgspec.structs.fields(struct):
        kind = msgspec.inspect.type_info(field.type)
        assert isinstance(kind, msgspec.inspect.Metadata) and kind.extra is not None, field.name
        if _is_options(field.type):
            flags: tuple[str, ...] = ("-X", "--kafka-option")
        else:
            flags = ("--" + field.name.replace("_", "-"),)
        declared.append(
            Setting(
                field.name,
                kind.extra["env"],
                (kind.extra_json_schema or {})["description"],
                kind.extra.get("default", _describe_default(field)),
                flags,
            )
        )
    return tuple(declared)


def _describe_default(field: msgspec.structs.FieldInfo) -> str:
    if field.default_factory is not msgspec.NODEFAULT or field.default is None:
        return "(none)"
    return str(field.default)


def _is_options(kind: Any) -> bool:
    """Whether a setting is librdkafka KEY=VALUE settings (a `dict`)."""
    return get_origin(_bare(kind)) is dict


def _bare(kind: Any) -> Any:
    return get_args(kind)[0] if get_origin(kind) is Annotated else kind


def _converted(name: str, kind: Any, given: Any, where: str) -> Any:
    """A value from a flag or the environment as its declared type; ConfigurationError naming
    the setting and `where` the value came from."""
    if _is_options(kind) and not isinstance(given, Mapping):
        items = split_kafka_options(given) if isinstance(given, str) else given
        return parse_kafka_options(items)
    try:
        return msgspec.convert(given, kind, strict=False, dec_hook=_path_from_text)
    except msgspec.ValidationError:
        raise ConfigurationError(f"{where}: {_refusal(name, kind, given)}") from None


def _path_from_text(kind: type, value: Any) -> Any:
    """msgspec `dec_hook` for values from flags and the environment: text becomes a Path."""
    if kind is Path and isinstance(value, str | Path):
        return Path(value)
    raise NotImplementedError(f"{kind} is not a setting type")


def _path_given(kind: type, value: Any) -> Any:
    """msgspec `dec_hook` for values given in code: a Path must already be one."""
    if kind is Path and isinstance(value, Path):
        return value
    raise TypeError(f"expected a Path, got {type(value).__name__}")


def _of_type(value: Any, kind: Any) -> bool:
    """Whether `value` has a type `kind` accepts, whatever its bounds (else it is a TypeError)."""
    origin = get_origin(kind)
    if origin is Annotated:
        return _of_type(value, get_args(kind)[0])
    if origin is Literal:
        return any(type(value) is type(allowed) for allowed in get_args(kind))
    if origin is Union or origin is types.UnionType:
        return any(_of_type(value, member) for member in get_args(kind))
    if kind is float:
        return type(value) in (int, float)
    if kind is int:
        return type(value) is int
    if kind is None or kind is type(None):
        return value is None
    return isinstance(value, origin or kind)


def _refusal(name: str, kind: Any, value: Any) -> str:
    """The refusal of a value: "max_batch_size must be an integer in 1..65536, got '0'"."""
    shown = "(not shown)" if _is_options(kind) else redact_urls(repr(value))
    return f"{name} must be {_rule_of(msgspec.inspect.type_info(kind))}, got {shown}"


def _rule_of(kind: msgspec.inspect.Type) -> str:
    """What a declared type accepts, in words: "an integer in 1..65536"."""
    if isinstance(kind, msgspec.inspect.Metadata):
        return _rule_of(kind.type)
    if isinstance(kind, msgspec.inspect.LiteralType):
        return "one of " + ", ".join(str(v) for v in kind.values)
    if isinstance(kind, msgspec.inspect.IntType | msgspec.inspect.FloatType):
        noun = "an integer" if isinstance(kind, msgspec.inspect.IntType) else "a number"
        low = kind.ge if kind.ge is not None else kind.gt
        high = kind.le if kind.le is not None else kind.lt
        if kind.ge is not None and kind.le is not None:
            return f"{noun} in {kind.ge}..{kind.le}"
        if low is not None:
            return f"{noun} {'>=' if kind.ge is not None else '>'} {low}"
        return noun if high is None else f"{noun} <= {high}"
    if isinstance(kind, msgspec.inspect.StrType):
        if kind.pattern == NAME_PATTERN:
            return "a topic name (letters, digits, . _ -)"
        if kind.pattern:
            return f"text matching {kind.pattern}"
        return "a non-empty string" if kind.min_length else "a string"
    if isinstance(kind, msgspec.inspect.DictType):
        return "KEY=VALUE settings"
    if isinstance(kind, msgspec.inspect.UnionType):
        return " or ".join(_rule_of(t) for t in kind.types)
    if isinstance(kind, msgspec.inspect.NoneType):
        return "unset"
    return "a file path"
