"""One record value through a typed msgspec decoder, its failures as the contracts' errors."""

from __future__ import annotations

from typing import TypeVar

import msgspec

from plumbing.errors import DecodeError, ValidationError

T = TypeVar("T")


def decode_value(decoder: msgspec.json.Decoder[T], value: bytes | None) -> T:
    """Decode and validate one record value.

    Raises:
        DecodeError: the value is missing, not UTF-8 or not well-formed JSON.
        ValidationError: the JSON breaks a rule of the decoder's type.
    """
    if value is None:
        raise DecodeError("record has no value (tombstone)")
    try:
        return decoder.decode(value)
    except msgspec.ValidationError as exc:
        # The typed decoder stops at the first wrong type, even in malformed JSON such as
        # `[1, 2`; an untyped pass (on this failure path only) tells the two causes apart.
        try:
            msgspec.json.decode(value)
        except RecursionError:
            raise DecodeError("JSON nested too deeply") from exc
        except msgspec.ValidationError:
            pass  # well-formed, but a number beyond what any type holds (1e999)
        except msgspec.DecodeError as malformed:
            raise DecodeError(str(malformed)) from exc
        raise ValidationError(str(exc)) from exc
    except msgspec.DecodeError as exc:
        raise DecodeError(str(exc)) from exc
    except RecursionError as exc:  # nesting deeper than any record has, e.g. [[[[…]]]]
        raise DecodeError("JSON nested too deeply") from exc
