"""Service settings: one frozen object, validated once."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InputError


@dataclass(frozen=True)
class ServeConfig:
    host: str = "127.0.0.1"
    """Loopback by default; bind elsewhere only on purpose."""
    port: int = 8000
    allow_dirs: tuple[str, ...] = ()
    """Folders ``{"path": ...}`` inputs may read from (resolved, symlinks followed). Empty: path inputs refused."""
    api_key: str | None = field(default=None, repr=False)
    """Bearer token required on /v1/* and /metrics when set."""
    max_batch_tokens: int = 16384
    """Token budget of one forward pass built from items of concurrent requests."""
    max_batch_items: int = 64
    """Most single items merged into one forward pass (1 turns cross-request batching off)."""
    max_wait_ms: float = 5.0
    """How long the first ready item waits for others to join its batch."""
    max_queue_items: int = 1024
    """Items admitted (preprocessing, waiting or scoring) before new requests get 503."""
    max_items_per_request: int = 256
    max_body_bytes: int = 64 * 1024 * 1024
    request_timeout_s: float = 120.0
    drain_timeout_s: float = 60.0
    """On SIGTERM: how long in-flight requests may take to finish."""

    def __post_init__(self) -> None:
        resolved = []
        for d in self.allow_dirs:
            p = Path(d).expanduser()
            if not p.is_dir():
                raise InputError(f"--allow-dir {d}", "is not an existing directory")
            resolved.append(os.path.realpath(p))
        object.__setattr__(self, "allow_dirs", tuple(resolved))
        checks = {
            "max_batch_tokens": self.max_batch_tokens >= 1,
            "max_batch_items": self.max_batch_items >= 1,
            "max_wait_ms": self.max_wait_ms >= 0,
            "max_queue_items": self.max_queue_items >= 1,
            "max_items_per_request": self.max_items_per_request >= 1,
            "max_body_bytes": self.max_body_bytes >= 1024,
            "request_timeout_s": self.request_timeout_s > 0,
            "port": 0 <= self.port <= 65535,
        }
        for name, ok in checks.items():
            if not ok:
                raise InputError(f"{name}={getattr(self, name)!r}", "is out of range")

    def public(self) -> dict:
        """Limits as reported by /v1/info (no secrets)."""
        return {
            "max_batch_tokens": self.max_batch_tokens,
            "max_batch_items": self.max_batch_items,
            "max_wait_ms": self.max_wait_ms,
            "max_queue_items": self.max_queue_items,
            "max_items_per_request": self.max_items_per_request,
            "max_body_bytes": self.max_body_bytes,
            "request_timeout_s": self.request_timeout_s,
            "path_inputs": bool(self.allow_dirs),
            "auth": self.api_key is not None,
        }
