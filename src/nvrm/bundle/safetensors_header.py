"""A safetensors file's header, read alone and bounded: every tensor's dtype, shape and byte range, no tensor read.

The format is 8 bytes (little-endian u64 ``n``), then ``n`` bytes of JSON mapping each tensor name to
``{"dtype", "shape", "data_offsets": [begin, end]}`` (plus an optional ``__metadata__``), then the data.
Read here by hand rather than through ``safetensors.safe_open``: that needs a framework (``"pt"`` imports
torch, seconds for ``nvrm verify``) and maps the whole file, while this reads at most
``MAX_HEADER_BYTES`` of a regular file and never opens a FIFO or a device (which could block forever).
A header that overstates the file, an entry of the wrong shape, or a byte range outside the data or at odds
with its dtype and shape is refused in one line (``HeaderError``, a ``ValueError``).
"""

from __future__ import annotations

import json
import math
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

MAX_HEADER_BYTES = 100_000_000
"""The largest header read (the safetensors library's own limit); a release shard's header is about 100 kB."""

DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
               "U32": 4, "I32": 4, "F32": 4, "U64": 8, "I64": 8, "F64": 8}
"""Bytes per element of each dtype the format names (a dtype not here is accepted with its byte range unchecked)."""


class HeaderError(ValueError):
    """A file that is not a readable safetensors file (its path and the reason, in one line)."""


@dataclass(frozen=True)
class TensorHeader:
    """One tensor as the header declares it."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    """offset of its first byte, counted from the end of the header"""
    end: int
    """offset one past its last byte"""

    @property
    def nbytes(self) -> int:
        """Bytes the tensor takes in the file."""
        return self.end - self.begin


def read_header(path: str | os.PathLike) -> dict[str, TensorHeader]:
    """Every tensor of the safetensors file ``path`` by name, from its header alone (``HeaderError`` when it is
    not a regular file, or its header is over ``MAX_HEADER_BYTES``, overstates the file or is malformed)."""
    path = Path(path)
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise HeaderError(f"{path}: not a regular file")
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) != 8:
            raise HeaderError(f"{path}: {len(head)} bytes, shorter than a safetensors header's length field")
        (n,) = struct.unpack("<Q", head)
        if n > min(MAX_HEADER_BYTES, st.st_size - 8):
            raise HeaderError(f"{path}: header length {n} is over {MAX_HEADER_BYTES} bytes or the file's {st.st_size}")
        raw = fh.read(n)
    try:
        meta = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise HeaderError(f"{path}: the header is not JSON ({type(e).__name__})") from None
    if not isinstance(meta, dict):
        raise HeaderError(f"{path}: the header is a JSON {type(meta).__name__}, not an object")
    data_bytes = st.st_size - 8 - n
    return {name: _entry(path, name, value, data_bytes) for name, value in meta.items() if name != "__metadata__"}


def _entry(path: Path, name: str, value: object, data_bytes: int) -> TensorHeader:
    if not isinstance(value, dict):
        raise HeaderError(f"{path}: tensor {name[:80]!r} is not described by an object")
    dtype, shape, offsets = value.get("dtype"), value.get("shape"), value.get("data_offsets")
    ok_shape = isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
    ok_offsets = (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
                  and 0 <= offsets[0] <= offsets[1] <= data_bytes)
    if not isinstance(dtype, str) or not ok_shape or not ok_offsets:
        raise HeaderError(f"{path}: tensor {name[:80]!r} has no valid dtype, shape or data_offsets within the file")
    width = DTYPE_BYTES.get(dtype)
    if width is not None and offsets[1] - offsets[0] != width * math.prod(shape):
        raise HeaderError(f"{path}: tensor {name[:80]!r} ({dtype} {shape}) spans {offsets[1] - offsets[0]} bytes, "
                          f"not {width * math.prod(shape)}")
    return TensorHeader(dtype, tuple(shape), offsets[0], offsets[1])


def declared_bytes(path: str | os.PathLike) -> int:
    """Bytes of every tensor the file's header declares (0 for a file that is not a readable safetensors file)."""
    try:
        return sum(t.nbytes for t in read_header(path).values())
    except (OSError, HeaderError):
        return 0
