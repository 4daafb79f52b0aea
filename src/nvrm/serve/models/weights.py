"""Which weights a served model holds, and what they weigh: read from files and tensors, no service state.

*Digest*, in the service, has one meaning: the sha256 of a bundle's integrity manifest, which names its weights
file by file (``weights_digest``). The wire calls it ``revision`` (each result's ``model_revision``, a request's
``expect_revision``, ``GET /v1/models``), as it always has; a Hub commit or the revision a training run records
is another thing, used here only as the fallback of a bundle that has no manifest.
"""

from __future__ import annotations

import hashlib
from pathlib import Path


def manifest_sha256(path: str | Path | None) -> str | None:
    """The sha256 of a bundle's integrity manifest (its digest), or None when it has none."""
    from ...bundle import MANIFEST_NAMES

    for name in MANIFEST_NAMES if path is not None else ():
        f = Path(path) / name  # type: ignore[arg-type]
        if f.is_file():
            return hashlib.sha256(f.read_bytes()).hexdigest()
    return None


def weights_digest(model) -> str:
    """A served model's digest: its manifest's sha256, else the revision it records, else ``unversioned``."""
    return manifest_sha256(getattr(model, "path", None)) or model.revision or "unversioned"


def model_bytes(model) -> int:
    """Bytes the model's weights hold (backbone and head parameters and buffers)."""
    total = 0
    for part in (getattr(model, "backbone", None), getattr(model, "head", None)):
        if part is not None and hasattr(part, "parameters"):
            tensors = list(part.parameters()) + list(part.buffers())
            total += sum(t.numel() * t.element_size() for t in tensors)
    return total


def bundle_weight_bytes(path: str | Path) -> int:
    """Bytes of the tensors a bundle's ``*.safetensors`` files declare, from their headers alone (nothing is loaded)."""
    from ...bundle.safetensors_header import declared_bytes

    return sum(declared_bytes(f) for f in sorted(Path(path).glob("*.safetensors")))


def free_memory(device) -> int:
    """Bytes a new model may take on ``device``: free device memory on CUDA, else the host's available RAM."""
    dev = str(device or "cpu")
    if dev.startswith("cuda"):
        import torch

        free, _ = torch.cuda.mem_get_info(torch.device(dev))
        return int(free)
    try:
        with open("/proc/meminfo") as f:  # Linux: what the kernel says can be had without swapping
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os

    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))  # elsewhere: the free pages


def release_freed_memory() -> None:
    """Hand freed memory back once a model is let go: a garbage collection, glibc's free heap pages (so a freed
    revision shows in the RSS), and CUDA's cached blocks."""
    import gc

    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001
        pass
