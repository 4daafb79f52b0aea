"""When two inputs are one input: the single rule behind RL grouping and the zero-signal check (pure).

Equal content is one input, whatever object carries it:

- a path (``str`` or ``os.PathLike``): the file it resolves to (``os.path.realpath``: relative
  spellings, ``..`` and symlinks are one path);
- ``bytes``, ``bytearray`` or ``memoryview``: their bytes;
- a NumPy array or a torch tensor (any device): its dtype, shape and bytes (arrays and tensors are
  different kinds: the scorer does not take them alike);
- a PIL image: its mode, size, palette and pixels;
- a ``Clip``: its fps and its frames' shape and bytes, NumPy or torch alike (its name is only for messages);
- a list or tuple (images, as the scorer takes them): its elements, in order, each by this rule;
- ``None``: the missing context of the ``no_context`` opt-in;
- anything else: only itself (object identity).

A path and the bytes of the same file are two inputs: keying files by content would read every
file on every call.

``input_key(value)`` is a hashable key: equal keys, one input. Content is hashed from a sample
(16 slices of 4 KiB) and compared in full only when the header and the sample agree, stopping at the
first differing chunk: keying G copies of one context costs G - 1 comparisons at memory speed, and
different contexts part on their sample. A key holds its content, so it is for one call's grouping,
not for storing. Nothing here imports torch or PIL: a tensor or an image is recognised only once its
module is loaded.
"""

from __future__ import annotations

import hashlib
import os
import sys
from typing import Any, Hashable, Sequence

import numpy as np

from ..clip import Clip, is_tensor

_SLICES, _SLICE = 16, 4096  # the sample the hash reads
_CHUNK = 1 << 18  # bytes compared at a time: two inputs that differ part after the first differing chunk


def input_key(value: Any) -> Hashable:
    """The key of one input: equal for equal content (the module's rule), different otherwise."""
    kind, head, content = _describe(value)
    if kind == "list":
        return (kind, head, tuple(input_key(v) for v in value))
    if kind == "object":
        return (kind, head, _Itself(value))
    return (kind, head) if content is None else (kind, head, _Content(content))


def input_keys(values: Sequence[Any]) -> list[Hashable]:
    """``input_key`` of each value, in order (one call's keys)."""
    return [input_key(v) for v in values]


def same_input(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` are one input: ``input_key(a) == input_key(b)``."""
    return a is b or input_key(a) == input_key(b)


def all_same(values: Sequence[Any]) -> bool:
    """Whether every value is the same input as the first (True for fewer than two); stops at the first other."""
    if len(values) < 2:
        return True
    first = input_key(values[0])
    return all(v is values[0] or input_key(v) == first for v in values[1:])


class _Content:
    """An array's or a tensor's bytes as a key part: hashed from a sample, equal only if every byte is."""

    __slots__ = ("data", "_sample")

    def __init__(self, data: Any):
        self.data = data
        self._sample: bytes | None = None

    def sample(self) -> bytes:
        if self._sample is None:
            self._sample = _sample_of(self.data)
        return self._sample

    def __hash__(self) -> int:
        return hash(self.sample())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _Content):
            return NotImplemented
        if self.data is other.data:
            return True
        a, b = self.data, other.data
        on_device = is_tensor(a) and is_tensor(b) and a.device == b.device and a.device.type != "cpu"  # compared there, not sampled
        if not on_device and self.sample() != other.sample():
            return False
        return _same_bytes(a, b)


class _Itself:
    """An object of no known kind as a key part: equal only to itself (and held, so its id stays its own)."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __hash__(self) -> int:
        return id(self.value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Itself) and self.value is other.value


def _describe(value: Any) -> tuple[str, tuple, Any]:
    """(kind, header, content): the header is cheap to compare; the content (None: the header says it all)
    is an array or tensor whose bytes decide."""
    if value is None:
        return "none", (), None
    if isinstance(value, (str, os.PathLike)):
        path = os.fspath(value)
        return "path", (os.path.realpath(path) if path else path,), None
    if isinstance(value, (bytes, bytearray, memoryview)):
        if isinstance(value, memoryview) and not value.c_contiguous:
            value = value.tobytes()  # its bytes in logical order
        flat = np.frombuffer(value, dtype=np.uint8)
        return "bytes", (flat.size,), flat
    if isinstance(value, Clip):
        return "clip", (float(value.fps), tuple(value.frames.shape)), value.frames  # uint8 frames, NumPy or torch alike
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:  # its bytes are pointers, not content
            return "object", (type(value).__qualname__,), None
        return "ndarray", (value.dtype.str, value.shape), value
    if is_tensor(value) and "torch" in sys.modules:
        return "tensor", (str(value.dtype).replace("torch.", ""), tuple(value.shape)), value
    image = _pil_image(value)
    if image is not None:
        palette = value.getpalette() if value.mode in ("P", "PA") else None
        head = (value.mode, value.size, hashlib.sha256(bytes(palette)).hexdigest() if palette else None)
        return "image", head, np.frombuffer(value.tobytes(), dtype=np.uint8)
    if isinstance(value, (list, tuple)):
        return "list", (len(value),), None
    return "object", (type(value).__qualname__,), None


def _pil_image(value: Any) -> Any:
    module = sys.modules.get("PIL.Image")
    return value if module is not None and isinstance(value, module.Image) else None


def _flat(data: Any) -> Any:
    """The bytes as a flat uint8 array or tensor, on the data's own device (a view where it can be)."""
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    import torch

    t = data.detach().contiguous().reshape(-1)
    return t.view(torch.uint8) if t.numel() else torch.zeros(0, dtype=torch.uint8, device=t.device)


def _host(flat: Any) -> np.ndarray:
    return flat if isinstance(flat, np.ndarray) else flat.cpu().numpy()


def _sample_of(data: Any) -> bytes:
    """16 evenly spaced slices of 4 KiB (the whole content when smaller): a device tensor copies only these."""
    flat = _flat(data)
    n = int(flat.shape[0])
    if n <= _SLICES * _SLICE:
        return _host(flat).tobytes()
    starts = [k * (n - _SLICE) // (_SLICES - 1) for k in range(_SLICES)]
    if isinstance(flat, np.ndarray):
        return b"".join(flat[s : s + _SLICE].tobytes() for s in starts)
    import torch

    return _host(torch.cat([flat[s : s + _SLICE] for s in starts])).tobytes()


def _same_bytes(a: Any, b: Any) -> bool:
    """Every byte equal, compared a chunk at a time (device tensors on their device: nothing copied)."""
    x, y = _flat(a), _flat(b)
    if int(x.shape[0]) != int(y.shape[0]):
        return False
    if not isinstance(x, np.ndarray) and not isinstance(y, np.ndarray) and x.device == y.device and x.device.type != "cpu":
        import torch

        return bool(torch.equal(x, y))
    x, y = _host(x), _host(y)
    return all(_same_chunk(x[i : i + _CHUNK], y[i : i + _CHUNK]) for i in range(0, x.size, _CHUNK))


def _same_chunk(x: np.ndarray, y: np.ndarray) -> bool:
    """One chunk of bytes, compared as 8-byte words where both allow it (8x fewer comparisons)."""
    if x.size % 8 == 0 and x.ctypes.data % 8 == 0 and y.ctypes.data % 8 == 0:
        x, y = x.view(np.uint64), y.view(np.uint64)
    return np.array_equal(x, y)
