"""Prometheus text-format metrics, thread-safe, no dependencies."""

from __future__ import annotations

import bisect
import threading
from typing import Callable

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def _escape(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items())) + "}"


class Counter:
    def __init__(self, name: str, help_text: str):
        self.name, self.help = name, help_text
        self._values: dict[tuple, float] = {}
        self._lock = threading.Lock()

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels: str) -> float:
        return self._values.get(tuple(sorted(labels.items())), 0.0)

    def render(self) -> list[str]:
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} counter"]
        with self._lock:
            for key, v in sorted(self._values.items()):
                out.append(f"{self.name}{_labels(dict(key))} {v:g}")
        return out


class Gauge:
    def __init__(self, name: str, help_text: str, read: Callable[[], float]):
        self.name, self.help, self.read = name, help_text, read

    def render(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} gauge", f"{self.name} {self.read():g}"]


class Histogram:
    def __init__(self, name: str, help_text: str, buckets: tuple[float, ...]):
        self.name, self.help, self.buckets = name, help_text, buckets
        self._series: dict[tuple, list] = {}
        self._lock = threading.Lock()

    def observe(self, value: float, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            counts, total = self._series.setdefault(key, [[0] * (len(self.buckets) + 1), 0.0])
            counts[bisect.bisect_left(self.buckets, value)] += 1
            self._series[key][1] = total + value

    def count(self, **labels: str) -> int:
        s = self._series.get(tuple(sorted(labels.items())))
        return sum(s[0]) if s else 0

    def render(self) -> list[str]:
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        with self._lock:
            for key, (counts, total) in sorted(self._series.items()):
                labels = dict(key)
                running = 0
                for bound, c in zip(self.buckets, counts):
                    running += c
                    out.append(f"{self.name}_bucket{_labels({**labels, 'le': f'{bound:g}'})} {running}")
                running += counts[-1]
                out.append(f"{self.name}_bucket{_labels({**labels, 'le': '+Inf'})} {running}")
                out.append(f"{self.name}_sum{_labels(labels)} {total:g}")
                out.append(f"{self.name}_count{_labels(labels)} {running}")
        return out


class Metrics:
    def __init__(self, queue_depth: Callable[[], float]):
        self.requests = Counter("nvrm_requests_total", "HTTP requests by endpoint and status code")
        self.items = Counter("nvrm_items_total", "Scored items by outcome (ok or error)")
        self.rejected = Counter("nvrm_rejected_total", "Requests refused before scoring, by reason")
        self.batch_size = Histogram("nvrm_batch_size", "Items per forward pass", SIZE_BUCKETS)
        self.batch_tokens = Histogram("nvrm_batch_tokens", "Tokens per forward pass", tuple(float(2**k) for k in range(8, 18)))
        self.latency = Histogram("nvrm_request_seconds", "Request latency by endpoint", LATENCY_BUCKETS)
        self.forward = Histogram("nvrm_forward_seconds", "Model time per forward pass (or group)", LATENCY_BUCKETS)
        self.queue_depth = Gauge("nvrm_queue_depth", "Items admitted and not yet answered", queue_depth)

    def render(self) -> str:
        lines: list[str] = []
        for m in (self.requests, self.items, self.rejected, self.batch_size, self.batch_tokens, self.latency, self.forward, self.queue_depth):
            lines += m.render()
        return "\n".join(lines) + "\n"
