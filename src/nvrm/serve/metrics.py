"""The service's Prometheus metrics (prometheus_client), one registry per app."""

from __future__ import annotations

from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TOKEN_BUCKETS = tuple(float(2**k) for k in range(8, 19))

__all__ = ["Metrics", "CONTENT_TYPE_LATEST"]


class Metrics:
    """Counters, histograms and gauges of one service instance."""

    def __init__(
        self,
        items_admitted: Callable[[], float],
        cache_bytes: Callable[[], float],
        prefix_bytes: Callable[[], float] = lambda: 0,
        store_bytes: Callable[[], float] = lambda: 0,
        inflight_bytes: Callable[[], float] = lambda: 0,
    ):
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("nvrm_requests", "HTTP requests by endpoint and status code", ["endpoint", "code"], registry=r)
        self.items = Counter("nvrm_items", "Scored items by outcome (ok or error)", ["outcome"], registry=r)
        self.rejected = Counter("nvrm_rejected", "Requests refused before scoring, by reason", ["reason"], registry=r)
        self.batch_size = Histogram("nvrm_batch_size", "Items per forward pass (or group)", buckets=SIZE_BUCKETS, registry=r)
        self.batch_tokens = Histogram("nvrm_batch_tokens", "Key positions per forward pass (rows x longest row)", buckets=TOKEN_BUCKETS, registry=r)
        self.latency = Histogram("nvrm_request_seconds", "Request latency by endpoint", ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.parse = Histogram("nvrm_parse_seconds", "CPU time parsing and decoding a request body (in a thread, off the event loop)",
                               buckets=LATENCY_BUCKETS, registry=r)
        self.context_hash = Histogram("nvrm_context_hash_seconds", "CPU time hashing a request's contexts for the shared-context cache",
                                      buckets=LATENCY_BUCKETS, registry=r)
        self.receive = Histogram("nvrm_receive_seconds", "Wall time receiving a request body and waiting for its parse to start",
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.forward = Histogram("nvrm_forward_seconds", "Model time per forward pass or group", ["kind"], buckets=LATENCY_BUCKETS, registry=r)
        self.context_cache = Counter("nvrm_context_cache", "Prepared-context lookups by result (hit, miss)", ["result"], registry=r)
        self.prefix_cache = Counter("nvrm_prefix_cache", "Kept-prefix lookups by result (hit, miss) for items of a shared context", ["result"], registry=r)
        self.context_store = Counter("nvrm_context_store", "Lookups of contexts named by ref, by result (hit, miss)", ["result"], registry=r)
        self.context_kept = Counter("nvrm_context_store_puts", "Contexts kept in the store: uploaded (POST /v1/contexts) or first sent inline", registry=r)
        self.upload_bytes = Counter("nvrm_request_bytes", "Request body bytes received, by endpoint", ["endpoint"], registry=r)
        self.shared = Counter("nvrm_shared_context_items", "Items scored as a group with other requests' items of the same context", registry=r)
        self.expired = Counter("nvrm_expired_items", "Items dropped before their forward pass because their request had timed out", registry=r)
        g = Gauge("nvrm_items_admitted", "Items admitted (preparing, waiting or scoring) and not yet answered", registry=r)
        g.set_function(items_admitted)
        c = Gauge("nvrm_context_cache_bytes", "Bytes held by the prepared-context cache", registry=r)
        c.set_function(cache_bytes)
        k = Gauge("nvrm_prefix_cache_bytes", "Device bytes held by kept prefixes (prefilled contexts)", registry=r)
        k.set_function(prefix_bytes)
        st = Gauge("nvrm_context_store_bytes", "Bytes held by uploaded contexts (named by ref)", registry=r)
        st.set_function(store_bytes)
        fl = Gauge("nvrm_inflight_bytes", "Bytes reserved by requests in flight (bodies and prepared-frame bounds; --max-inflight-mb)", registry=r)
        fl.set_function(inflight_bytes)

    @staticmethod
    def lookups(metric) -> Callable[[bool], None]:
        """A cache's ``on_lookup``: counts each lookup of ``metric`` (labelled ``result``) as a hit or a miss."""
        return lambda hit: metric.labels(result="hit" if hit else "miss").inc()

    def follow_monitors(self, snapshots: Callable[[], dict[str, dict]]) -> None:
        """Export the rolling monitors ``snapshots()`` gives ({model name: ``Monitor.snapshot()``}) as gauges, read at each scrape."""
        self.registry.register(_MonitorCollector(snapshots))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _MonitorCollector:
    """The per-model monitors (``nvrm.guard.monitor``) as gauges: reward mean and spread, uncertainty mean and the share of
    doubtful items (the guard's, and the members' where they run), each monitored frame statistic's mean, the probe's rate,
    and whether the state is suspect."""

    def __init__(self, snapshots: Callable[[], dict[str, dict]]):
        self.snapshots = snapshots

    def describe(self):
        return []

    def collect(self):
        rows = {
            "nvrm_monitor_items": ("Items in each model's monitor window", lambda s: s["items"]),
            "nvrm_monitor_reward_mean": ("Mean reward over the monitor window", lambda s: s["reward"]["mean"]),
            "nvrm_monitor_reward_std": ("Spread of the reward over the monitor window", lambda s: s["reward"]["std"]),
            "nvrm_monitor_uncertainty_mean": ("Mean uncertainty over the monitor window (the guard's)", lambda s: s["uncertainty"]["mean"]),
            "nvrm_monitor_doubtful_share": ("Share of the window's items above the guard's threshold", lambda s: s["uncertainty"]["share_above"]),
            "nvrm_monitor_members_doubtful_share": ("Share of the items the members checked that are doubtful with them (--members, --member-rate)",
                                                    lambda s: s.get("members", {}).get("share_above")),
            "nvrm_monitor_probe_above_share": ("Share of sampled probe perturbations that scored above their item", lambda s: s["probe"]["above_original"]),
            "nvrm_monitor_suspect": ("1 while the monitor calls the stream suspect (the hacking signature), else 0", lambda s: s["state"] == "suspect"),
        }
        snaps = self.snapshots()
        for name, (text, pick) in rows.items():
            g = GaugeMetricFamily(name, text, labels=["model"])
            for model, snap in snaps.items():
                value = pick(snap)
                if value is not None:
                    g.add_metric([model], float(value))
            yield g
        frames = GaugeMetricFamily("nvrm_monitor_frame_stat", "Mean of a frame statistic of the window's candidates", labels=["model", "stat"])
        for model, snap in snaps.items():
            for stat, v in snap.get("frames", {}).items():
                if v.get("mean") is not None:
                    frames.add_metric([model, stat], float(v["mean"]))
        yield frames
