"""A file read whole only when it is small enough: the one way the project reads a file an
operator or a pipeline hands it (rules, input mapping, model package).

A file whose size on disk is past the bound is refused before any of it is read. Its size may
lie (a file still being written, a device or a pipe with no size), so the reading itself stops
one byte past the bound: a file past the bound costs no more than one at it. OSError passes
through, for the caller to name the file.
"""

from __future__ import annotations

import os
from pathlib import Path

from plumbing.errors import ConfigurationError

#: Read in pieces of this size once the size on disk is known to be wrong.
_CHUNK_BYTES = 1 << 20


def read_bounded(path: Path, limit: int, what: str, hint: str = "") -> bytes:
    """The bytes of `path`; ConfigurationError naming `what` past `limit` bytes (then `hint`,
    what to do instead)."""
    too_large = ConfigurationError(f"{what} is larger than {limit:,} bytes{hint and ': ' + hint}")
    with path.open("rb") as file:
        size = os.fstat(file.fileno()).st_size
        if size > limit:
            raise too_large
        data = file.read(size + 1)  # the common case: one read, no copy
        if len(data) <= size:
            return data
        chunks = [data]
        total = len(data)
        while total <= limit and (chunk := file.read(min(_CHUNK_BYTES, limit + 1 - total))):
            chunks.append(chunk)
            total += len(chunk)
    if total > limit:
        raise too_large
    return b"".join(chunks)
