"""Service settings: one frozen object, validated once; ``nvrm serve``'s flags are generated from it."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

from ..errors import ConfigError
from .._fields import meta as _help

MAX_MB = 1 << 24
"""Largest size flag accepted, in MiB (16 TiB): beyond it a number is a typo, not a budget."""
SECRET_QUERY_KEYS = re.compile(r"pass|secret|token|auth|cred|key", re.IGNORECASE)
"""Query parameters of a URL setting (``--job-store``) whose values are never shown (``?password=...``, ``ssl_password``, ...)."""


def redacted(url: str) -> str:
    """``url`` without its secrets (for messages): no user or password, no value of a query parameter that may hold one."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "(a Redis URL that does not parse)"
    if "://" not in url:  # not a URL at all (``memory``, a typo): shown as given, unless it may hold a password
        return url if "@" not in url and "?" not in url else "(a value that may hold a password)"
    netloc = parts.netloc if "@" not in parts.netloc else "***@" + parts.netloc.rpartition("@")[2]
    query = "&".join(f"{p.partition('=')[0]}=***" if SECRET_QUERY_KEYS.search(unquote(p.partition("=")[0])) else p
                     for p in parts.query.split("&")) if parts.query else ""
    return f"{parts.scheme}://{netloc}{parts.path}" + (f"?{query}" if query else "")


def secrets_of(url: str) -> list[str]:
    """The secrets ``url`` holds (its password, and the values ``redacted`` hides), raw and decoded, longest first."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return [url]
    found = []
    if "@" in parts.netloc:
        found += [parts.netloc.rpartition("@")[0], parts.netloc.rpartition("@")[0].partition(":")[2]]
    for p in parts.query.split("&") if parts.query else ():
        key, _, value = p.partition("=")
        if SECRET_QUERY_KEYS.search(unquote(key)):
            found.append(value)
    found += [unquote(s) for s in found]
    return sorted({s for s in found if s}, key=len, reverse=True)


def scrub(text: str, secrets: list[str]) -> str:
    """``text`` on one line, each of ``secrets`` in it replaced by ``***``."""
    text = " ".join(str(text).split())
    for s in secrets:
        text = text.replace(s, "***")
    return text


def parse_watch_specs(values: tuple[str, ...] | list[str]) -> list[tuple[str, str]]:
    """``--watch`` values -> ``[(name, dir)]``; each is ``NAME=DIR``, a name watched once."""
    specs: list[tuple[str, str]] = []
    for v in values:
        name, sep, where = v.partition("=")
        if not sep or not name or not where:
            raise ConfigError(f"--watch {v!r}: give NAME=DIR (the served model's name, the folder nvrm train exports to)")
        if any(name == n for n, _ in specs):
            raise ConfigError(f"--watch {v!r}: the model {name!r} is watched twice; watch one folder per model")
        specs.append((name, where))
    return specs




@dataclass(frozen=True)
class ServeConfig:
    """How the reward service listens, batches and protects itself (model settings are ``LoadSettings``)."""

    host: str = field(default="127.0.0.1", metadata=_help("address to bind; loopback by default, bind elsewhere only on purpose"))
    port: int = field(default=8000, metadata=_help("port to listen on"))
    allow_dirs: tuple[str, ...] = field(
        default=(),
        metadata=_help('folder {"path": ...} inputs may read (symlinks resolved first; repeatable); none: path inputs refused',
                       flag="--allow-dir", repeat=True),
    )
    api_key_env: str | None = field(
        default=None, metadata=_help("name of the environment variable holding the bearer token required on /v1/* and /metrics")
    )
    max_batch_items: int = field(default=64, metadata=_help("items merged into one forward pass across requests (1 turns cross-request batching off)"))
    max_wait_ms: float = field(default=5.0, metadata=_help("how long the first ready item waits for others to join its batch"))
    share_wait_ms: float = field(
        default=50.0, metadata=_help("how long a ready item waits for items of its own context still being prepared (they share its prefix)")
    )
    max_queue_items: int = field(default=1024, metadata=_help("items admitted (preparing, waiting or scoring) before new requests get 503"))
    max_inflight_mb: float = field(
        default=4096.0,
        metadata=_help("bytes requests may hold at once: their bodies and an upper bound of their prepared frames; "
                       "more get 503 (the memory model: README, Limits)"),
    )
    max_body_mb: float = field(default=64.0, metadata=_help("request body size limit, enforced while the body streams in"))
    body_timeout_s: float = field(default=30.0, metadata=_help("a request body must arrive whole within this many seconds (slow senders get 408)"))
    max_connections: int = field(default=512, metadata=_help("open connections and requests at once; more get 503 at once (uvicorn's limit_concurrency)"))
    request_timeout_s: float = field(default=120.0, metadata=_help("per-request deadline: a JSON 504 after it, and its items are dropped before their forward"))
    drain_timeout_s: float = field(default=60.0, metadata=_help("on SIGTERM, how long in-flight requests may take to finish"))
    context_cache_mb: float = field(
        default=512.0, metadata=_help("prepared contexts kept for later requests (LRU, by content); 0 turns context sharing off")
    )
    context_store_mb: float = field(
        default=1024.0,
        metadata=_help("contexts uploaded once (POST /v1/contexts) and named by content hash in later requests (LRU); 0 turns uploads off"),
    )
    prefix_cache_mb: float = field(
        default=512.0,
        metadata=_help("prefilled contexts (their KV, on the model's device) kept so later items of the same context run only their own tokens (LRU); "
                       "0 turns it off"),
    )
    max_jobs: int = field(default=4096, metadata=_help("asynchronous jobs held at once, running or finished (/v1/jobs, cosmos-rl's enqueue); more get 503"))
    job_ttl_s: float = field(default=900.0, metadata=_help("how long a finished job's result is kept, however often it is fetched"))
    max_job_results_mb: float = field(default=64.0, metadata=_help("bytes of finished jobs' results kept; the oldest finished go first"))
    job_store: str = field(
        default="memory", repr=False,  # a Redis URL may hold a password: never in a repr
        metadata=_help("where jobs live: memory (this process) or redis://HOST:PORT/DB, shared by every replica (nvrm[redis]; "
                       "a Redis whose maxmemory-policy evicts any key, allkeys-*, is refused)"),
    )
    job_namespace: str = field(default="nvrm", metadata=_help("prefix of this service's Redis keys"))
    job_lease_s: float = field(
        default=30.0, metadata=_help("lease of a job taken from the Redis queue: one not renewed this long goes back to the queue")
    )
    job_workers: int = field(default=16, metadata=_help("jobs this replica takes from the Redis queue and scores at once"))
    job_attempts: int = field(default=3, metadata=_help(
        "times a Redis job is handed to a replica: one whose replica died (its lease ran out) this often fails with the reason"))
    replica_id: str | None = field(
        default=None, metadata=_help("this replica's name, answered as replica_id on enqueue (cosmos-rl pins pulls to it)")
    )
    latent_decoder: str | None = field(
        default=None, metadata=_help("a Wan VAE (diffusers AutoencoderKLWan folder, or Wan2.1_VAE.pth) to decode cosmos-rl's latents with: "
                                    "Wan2.1's for 16-channel latents, Wan2.2's for 48 (nvrm[cosmos])")
    )
    decode_workers: int = field(
        default=-1, metadata=_help("processes decoding --latent-decoder's latents side by side on the CPU, one thread each (-1: one per "
                                   "torch thread, at most 4; 0: on a thread of the server's own process); a GPU decodes in process")
    )
    decode_timeout_s: float = field(
        default=30.0, metadata=_help("seconds a decode worker may send nothing (it reports twice a second while it decodes) before it is "
                                     "taken for hung: killed, started again and given its batch once more")
    )
    context_frames: int = field(
        default=1, metadata=_help("leading frames of a cosmos-rl rollout that are its context (the conditioning frames; 0: text-to-world)")
    )
    cosmos_fallback_score: float = field(
        default=-5.0, metadata=_help("the score a cosmos-rl rollout that failed gets (named in the answer's errors list); default cosmos-rl's clip floor")
    )
    cosmos_image_as: str = field(
        default="refuse",
        metadata=_help("what a cosmos-rl media_type image rollout becomes: refuse (a still image is not a 5 s continuation), "
                       "or still (held still for --context-frames and the candidate's length; the answer is flagged)", choices=("refuse", "still")),
    )
    api_key: str | None = field(default=None, repr=False, metadata={"cli": False})
    """The bearer token itself (read from ``api_key_env`` by the CLI; never a flag)."""
    admin_key_env: str | None = field(
        default=None, metadata=_help("name of the environment variable holding the admin key a model swap (PUT /v1/models/NAME) needs; unset: no swaps")
    )
    allow_contract_change: bool = field(default=False, metadata=_help("let a model swap load a bundle whose contract differs from the running model's"))
    swap_mode: str = field(default="beside", metadata=_help(
        "how a model swap loads the new bundle: beside (the old one serves until the switch; refused when both do not fit "
        "in memory), or replace (the old one drains and is freed first: requests wait meanwhile)", choices=("beside", "replace")))
    admin_key: str | None = field(default=None, repr=False, metadata={"cli": False})
    """The admin key itself (read from ``admin_key_env`` by the CLI; never a flag)."""
    watch: tuple[str, ...] = field(default=(), metadata=_help(
        "NAME=DIR: swap model NAME when a new complete bundle lands in DIR (nvrm train's export; verified, warmed; repeatable)",
        flag="--watch", repeat=True))
    watch_interval_s: float = field(default=2.0, metadata=_help("how often --watch looks for a new bundle, in seconds"))
    record: str | None = field(default=None, metadata=_help(
        "folder to keep what is scored in (prompt, context, candidate frames, reward, revision, group; docs/record.md); off by default"))
    record_mb: float = field(default=10240.0, metadata=_help(
        "most bytes --record keeps on disk; the oldest rows (and files only they use) go first"))
    record_rate: float = field(default=1.0, metadata=_help(
        "share of request groups --record keeps (0..1, deterministic for --record-seed)"))
    record_seed: int = field(default=0, metadata=_help("seed of --record-rate's draw"))
    conservative: float | None = field(default=None, metadata=_help(
        "λ for the protocols whose clients cannot ask for it (cosmos-rl, UniRL, verl-omni's /drm): they hand out reward - λ x "
        "uncertainty instead of the raw reward (every model needs a guard; /v1 requests ask with their own conservative field)"))
    probe_rate: float = field(default=0.0, metadata=_help(
        "share of scored items probed off the request path: one degrading perturbation of nvrm probe's, scored on the same "
        "model, and its monitor reports how often it scored above the original (each probe costs one more item)"))
    monitor_window: int = field(default=512, metadata=_help("items each model's monitor (GET /v1/models/NAME/monitor) rolls over"))
    monitor_min_items: int = field(default=32, metadata=_help("items a monitor needs before it calls a stream suspect"))

    def __post_init__(self) -> None:
        resolved = []
        for d in self.allow_dirs:
            p = Path(d).expanduser()
            if not p.is_dir():
                raise ConfigError(f"--allow-dir {d}: is not an existing directory")
            resolved.append(os.path.realpath(p))
        object.__setattr__(self, "allow_dirs", tuple(resolved))
        if self.latent_decoder is not None and not Path(self.latent_decoder).exists():
            raise ConfigError(f"--latent-decoder {self.latent_decoder}: no such folder or file (a diffusers AutoencoderKLWan folder, or Wan2.1_VAE.pth)")
        checks = {
            "max_batch_items": self.max_batch_items >= 1,
            "max_wait_ms": self.max_wait_ms >= 0,
            "share_wait_ms": self.share_wait_ms >= 0,
            "max_queue_items": self.max_queue_items >= 1,
            "max_body_mb": self.max_body_mb > 0,
            "max_inflight_mb": self.max_inflight_mb > 0,
            "request_timeout_s": self.request_timeout_s > 0,
            "body_timeout_s": self.body_timeout_s > 0,
            "max_connections": self.max_connections >= 1,
            "drain_timeout_s": self.drain_timeout_s >= 0,
            "context_cache_mb": self.context_cache_mb >= 0,
            "prefix_cache_mb": self.prefix_cache_mb >= 0,
            "context_store_mb": self.context_store_mb >= 0,
            "max_jobs": self.max_jobs >= 1,
            "job_ttl_s": self.job_ttl_s > 0,
            "max_job_results_mb": self.max_job_results_mb > 0,
            "job_lease_s": self.job_lease_s > 0,
            "job_workers": self.job_workers >= 1,
            "job_attempts": self.job_attempts >= 1,
            "context_frames": self.context_frames >= 0,
            "decode_workers": self.decode_workers >= -1,
            "decode_timeout_s": self.decode_timeout_s >= 2,
            "cosmos_fallback_score": True,
            "record_mb": self.record_mb > 0,
            "watch_interval_s": self.watch_interval_s > 0,
            "record_rate": 0.0 <= self.record_rate <= 1.0,
            "conservative": self.conservative is None or self.conservative >= 0,
            "probe_rate": 0.0 <= self.probe_rate <= 1.0,
            "monitor_window": 2 <= self.monitor_window <= 1_000_000,
            "monitor_min_items": 2 <= self.monitor_min_items <= self.monitor_window,
            "port": 0 <= self.port <= 65535,
        }
        for name, ok in checks.items():
            value = getattr(self, name)
            if not ok or (isinstance(value, float) and not math.isfinite(value)):
                raise ConfigError(f"{name}={value!r} is out of range (a finite number is needed)")
            if name.endswith("_mb") and value > MAX_MB:
                raise ConfigError(f"{name}={value!r} is more than {MAX_MB} MiB; give the memory this server may use")
        if self.job_store != "memory" and not self.job_store.startswith(("redis://", "rediss://", "unix://")):
            raise ConfigError(f"--job-store {redacted(self.job_store)!r}: use memory, or redis://HOST:PORT/DB for a store every "
                              "replica shares")
        if self.watch:
            object.__setattr__(self, "watch", tuple(self.watch))
            parse_watch_specs(self.watch)
        if self.swap_mode not in ("beside", "replace"):
            raise ConfigError(f"--swap-mode {self.swap_mode!r}: use beside (load beside the old model), or replace (drain it, then load)")
        if self.cosmos_image_as not in ("refuse", "still"):
            raise ConfigError(f"--cosmos-image-as {self.cosmos_image_as!r}: use refuse, or still to score each image held still (flagged)")
        if not self.job_namespace or any(c in self.job_namespace for c in " :{}*?[]\\"):
            raise ConfigError(f"--job-namespace {self.job_namespace!r}: use a plain name (letters, digits, - _ .)")

    def monitor_settings(self):
        """The ``MonitorSettings`` of each served model's monitor."""
        from ..guard.monitor import MonitorSettings

        return MonitorSettings(window=self.monitor_window, min_items=self.monitor_min_items)

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_body_mb * 1024 * 1024)

    def public(self) -> dict:
        """Settings as reported by /v1/info (no secrets)."""
        return {
            "max_batch_items": self.max_batch_items,
            "max_wait_ms": self.max_wait_ms,
            "share_wait_ms": self.share_wait_ms,
            "max_queue_items": self.max_queue_items,
            "max_body_bytes": self.max_body_bytes,
            "request_timeout_s": self.request_timeout_s,
            "context_cache_mb": self.context_cache_mb,
            "max_inflight_mb": self.max_inflight_mb,
            "prefix_cache_mb": self.prefix_cache_mb,
            "context_store_mb": self.context_store_mb,
            "path_inputs": bool(self.allow_dirs),
            "auth": self.api_key is not None,
            "max_jobs": self.max_jobs,
            "job_ttl_s": self.job_ttl_s,
            "job_store": "memory" if self.job_store == "memory" else "redis",
            "latent_decoder": self.latent_decoder is not None,
            "context_frames": self.context_frames,
            "cosmos_fallback_score": self.cosmos_fallback_score,
            "cosmos_image_as": self.cosmos_image_as,
            "conservative": self.conservative,
        }
