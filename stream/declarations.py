"""Settings declared as msgspec fields, read back: their help for `--help`, and validation
errors in words that name the setting, what it accepts and the value.

A setting is declared as `Annotated[type, meta(env, help, **bounds)] = default` on a
`msgspec.Struct` (`stream/config.py`); everything here works from those declarations alone.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import msgspec


def meta(env: str, help: str, **bounds: Any) -> msgspec.Meta:
    """The declaration of a setting: its environment variable, its help, its bounds."""
    return msgspec.Meta(description=help, extra={"env": env}, **bounds)


class Setting(NamedTuple):
    """One declared setting, as `--help` and the deploy checks read it."""

    name: str
    env: str
    help: str
    #: The documented default, as text.
    default: str


def declared_settings(struct: type[msgspec.Struct]) -> tuple[Setting, ...]:
    """Every setting of `struct`, in declaration order."""
    info = msgspec.inspect.type_info(struct)
    assert isinstance(info, msgspec.inspect.StructType)
    declared = []
    for field in info.fields:
        kind = field.type
        assert isinstance(kind, msgspec.inspect.Metadata) and kind.extra is not None
        declared.append(
            Setting(
                field.name,
                kind.extra["env"],
                (kind.extra_json_schema or {})["description"],
                _describe_default(field),
            )
        )
    return tuple(declared)


def _describe_default(field: msgspec.inspect.Field) -> str:
    if field.default_factory is not msgspec.NODEFAULT or field.default is None:
        return "(derived)" if field.name == "instance_id" else "(none)"
    return str(field.default)


def decode_path(kind: type, value: Any) -> Any:
    """msgspec `dec_hook` for values from flags and the environment: text becomes a Path."""
    if kind is Path and isinstance(value, str | Path):
        return Path(value)
    raise NotImplementedError(f"{kind} is not a setting type")


def check_path(kind: type, value: Any) -> Any:
    """msgspec `dec_hook` for values given in code: a Path must already be one."""
    if kind is Path and isinstance(value, Path):
        return value
    raise TypeError(f"Expected `Path`, got `{type(value).__name__}`")


_PATH = re.compile(r" - at `\$\.([a-z_]+)`")


def field_of(exc: msgspec.ValidationError) -> str | None:
    """The setting a msgspec validation error is about, if it names one."""
    match = _PATH.search(str(exc))
    return match.group(1) if match else None


def readable_error(
    exc: msgspec.ValidationError, values: Mapping[str, Any], rules: Mapping[str, str]
) -> TypeError | ValueError:
    """msgspec's message ("Expected `int` >= 1 - at `$.max_batch_size`") as one naming the
    setting, what it accepts and the value, typed as TypeError (wrong type) or ValueError."""
    text = str(exc)
    name = field_of(exc)
    if name is None:
        return ValueError(text)
    shown = "(not shown)" if name == "kafka_options" else repr(values.get(name))
    message = f"{name} must be {rules[name]}, got {shown}"
    return TypeError(message) if ", got `" in text else ValueError(message)


def rules_of(struct: type[msgspec.Struct]) -> dict[str, str]:
    """What each setting of `struct` accepts, in words."""
    info = msgspec.inspect.type_info(struct)
    assert isinstance(info, msgspec.inspect.StructType)
    return {field.name: _rule_of(field.type) for field in info.fields}


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
        if kind.pattern:
            return "a topic name (letters, digits, . _ -)"
        return "a non-empty string" if kind.min_length else "a string"
    if isinstance(kind, msgspec.inspect.DictType):
        return "KEY=VALUE settings"
    if isinstance(kind, msgspec.inspect.UnionType):
        return " or ".join(_rule_of(t) for t in kind.types)
    if isinstance(kind, msgspec.inspect.NoneType):
        return "unset"
    return "a file path"
