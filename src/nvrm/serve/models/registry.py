"""Several reward models by name behind one service, each one swappable under load.

    registry: name ─► Entry (model, its scheduler, its caches, in-flight count)   one atomic pointer per name

A request names a ``model`` (default: the first); it is parsed by that model's contract, and admitted to
the entry the pointer holds when it is handled: it counts as in flight there until it is answered, so a
swap (``model_swap.swap``) never moves it. A retired entry is freed once its last request is answered.

Caches: the context store (content) is the service's; the prepared-context cache and the prefix cache
(KV of one revision's weights) belong to an entry, so nothing one revision prepared or scored is served
as another's. ``MultiServing`` is ``Serving`` with that routing; one model named ``nvrm`` is today's service.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from pathlib import Path
from typing import Any, Callable

from ...errors import ConfigError, RequestError
from ...protocol import ErrorCode
from ...results import item_dict
from ..config import ServeConfig
from ..batching.contexts import ContextCache, PrefixCache
from ..admission.requests import Work
from ..batching.scheduler import Scheduler
from ..serving import Reply, Serving

log = logging.getLogger(__name__)

DEFAULT_NAME = "nvrm"
"""The name of a model given without one (``--model DIR``); cosmos-rl's reward name for nvrm."""


def parse_model_specs(values: list[str] | str) -> list[tuple[str, str]]:
    """``--model`` values -> ``[(name, dir)]``: ``NAME=DIR`` (repeatable), or one plain ``DIR`` named ``nvrm``."""
    values = [values] if isinstance(values, str) else list(values)
    specs: list[tuple[str, str]] = []
    for v in values:
        name, sep, where = v.partition("=")
        if not sep or "/" in name or not name:
            name, where = DEFAULT_NAME, v
        if not where:
            raise ConfigError(f"--model {v!r}: give a bundle directory, or NAME=DIR")
        if not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise ConfigError(f"--model {v!r}: a model name is letters, digits and - _ .")
        if any(name == n for n, _ in specs):
            raise ConfigError(f"--model {v!r}: the name {name!r} is given twice; name each model once (NAME=DIR)")
        specs.append((name, where))
    if not specs:
        raise ConfigError("--model: give at least one bundle directory")
    return specs


def manifest_sha256(path: str | Path | None) -> str | None:
    """The sha256 of a bundle's integrity manifest (its revision here), or None when it has none."""
    from ...bundle import MANIFEST_NAMES

    for name in MANIFEST_NAMES if path is not None else ():
        f = Path(path) / name  # type: ignore[arg-type]
        if f.is_file():
            return hashlib.sha256(f.read_bytes()).hexdigest()
    return None


def revision_of(model) -> str:
    """A served model's revision: its manifest's sha256, else the revision it records, else ``unversioned``."""
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


class NamedModels:
    """A loader of several named bundles (``--model NAME=DIR``): called, it loads the first; ``create_app``
    installs the rest through ``rest()``."""

    def __init__(self, specs: list[tuple[str, str]], load: Callable[[str], Any]):
        self.specs, self.load = specs, load

    @property
    def names(self) -> list[str]:
        """The models' names, the default first."""
        return [n for n, _ in self.specs]

    def __call__(self):
        return self.load(self.specs[0][1])

    def rest(self) -> list[tuple[str, Any]]:
        """The other models, loaded in order."""
        return [(name, self.load(where)) for name, where in self.specs[1:]]


class Entry:
    """One revision of one named model, with its own scheduler and caches."""

    def __init__(self, name: str, model, config: ServeConfig, metrics, caches: tuple[ContextCache, PrefixCache]):
        self.name, self.model, self.revision = name, model, revision_of(model)
        self.cache, self.prefixes = caches
        c = config
        self.scheduler = Scheduler(model, max_batch_items=c.max_batch_items, max_wait_ms=c.max_wait_ms, share_wait_ms=c.share_wait_ms,
                                   max_queue_items=c.max_queue_items, metrics=metrics, cache=self.cache, prefixes=self.prefixes)
        self.inflight = 0
        self.retired = False
        self.memory = model_bytes(model)
        self.fingerprint, self.path = model.fingerprint, getattr(model, "path", None)  # still listed once the model is freed

    def describe(self) -> dict[str, Any]:
        """What ``GET /v1/models`` lists of it."""
        return {
            "name": self.name, "revision": self.revision, "contract": self.fingerprint,
            "state": ("draining" if self.inflight else "freeing") if self.retired else "serving",
            "memory_bytes": self.memory, "in_flight": self.inflight,
            "path": str(self.path) if self.path else None,
        }

    def free(self, drain_s: float) -> None:
        """Stop its scheduler and let go of its model and caches (a retired entry, nothing in flight)."""
        try:
            self.scheduler.begin_drain(drain_s)
            self.scheduler.stop(drain_s)
            self.prefixes.clear()
            self.model.close()
        except Exception:  # noqa: BLE001 — freeing an old revision never takes down the service
            log.exception("freeing model %s revision %s failed", self.name, self.revision)
        self.model = self.scheduler = None  # type: ignore[assignment] - nothing left holds the weights
        _release_device_memory()
        log.info("model %s: revision %s freed", self.name, self.revision)


def _release_device_memory() -> None:
    import gc

    gc.collect()
    try:  # glibc keeps freed heap pages; hand them back so a freed revision shows in the RSS
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


class Registry:
    """name -> the entry serving it (one pointer each, switched atomically), the entries still draining,
    and the one swap that may run at a time."""

    def __init__(self, drain_s: float):
        self._lock = threading.Lock()
        self.entries: dict[str, Entry] = {}
        self.retiring: list[Entry] = []
        self.swapping = threading.Lock()
        self.drain_s = drain_s
        self.replacing: set[str] = set()
        """Names whose old revision is drained before the new one loads (``--swap-mode replace``): 503 meanwhile."""
        self.switched: list[Callable[[str, str, str], None]] = []
        """Called with (name, old revision, new revision) each time ``add`` serves another revision under a name (every
        swap: ``PUT /v1/models``, ``--watch``, a Ray roll); the Redis job store records it for the queued jobs."""

    @property
    def names(self) -> list[str]:
        """The served names, the default first."""
        return list(self.entries)

    def revisions(self, *, serving: bool = False) -> dict[str, str]:
        """{name: the revision serving it} (``serving``: without the names ``--swap-mode replace`` is loading)."""
        with self._lock:
            return {n: e.revision for n, e in self.entries.items() if not (serving and n in self.replacing)}

    def current(self, name: str | None) -> Entry:
        """The entry serving ``name`` (None: the first); ``RequestError`` (400) naming the served models if unknown."""
        with self._lock:
            return self._lookup(name)

    def _lookup(self, name: str | None) -> Entry:
        if name is None and self.entries:
            name = next(iter(self.entries))
        if name not in self.entries:
            names = ", ".join(self.entries)
            raise RequestError("model", f"{name!r} is not served here; the models are: {names}", code=ErrorCode.MODEL_UNKNOWN)
        if name in self.replacing:
            raise RequestError("model", f"{name!r} is being replaced (--swap-mode replace: its old revision is freed before the new one "
                               "loads); retry shortly", 503, ErrorCode.UNAVAILABLE)
        return self.entries[name]  # type: ignore[index]

    def hold(self, name: str) -> Entry:
        """Stop admitting requests to ``name`` (503 until ``add`` serves its new entry) and retire the entry serving it;
        it is freed once drained (``drained`` waits for that)."""
        with self._lock:
            old = self.entries[name]
            self.replacing.add(name)
            idle = self._retire(old)
        if idle:
            self._free(old)
        return old

    def drained(self, e: Entry, seconds: float) -> bool:
        """Wait up to ``seconds`` (and the freeing itself) for a retired entry to be answered out and freed."""
        import time

        deadline = time.monotonic() + seconds + 30
        while time.monotonic() < deadline:
            with self._lock:
                if e not in self.retiring:
                    return True
            time.sleep(0.02)
        return False

    def acquire(self, name: str | None) -> Entry:
        """The entry serving ``name``, counted in flight until ``release``."""
        with self._lock:
            e = self._lookup(name)
            e.inflight += 1
            return e

    def release(self, e: Entry) -> None:
        """One request of ``e`` answered; a retired entry whose last one it was is freed (in a thread)."""
        with self._lock:
            e.inflight -= 1
            done = e.retired and e.inflight == 0
        if done:
            self._free(e)

    def add(self, e: Entry) -> Entry | None:
        """Serve ``e`` under its name from now on (atomically); the entry it replaces is retired and returned."""
        with self._lock:
            old = self.entries.get(e.name)
            self.entries[e.name] = e
            self.replacing.discard(e.name)
            held = old is None or old.retired  # none, or held and drained already (--swap-mode replace)
            idle = False if held else self._retire(old)  # type: ignore[arg-type]
        if old is not None and old.revision != e.revision:
            for note in list(self.switched):
                try:
                    note(e.name, old.revision, e.revision)
                except Exception:  # noqa: BLE001 - a listener never fails a swap
                    log.exception("model %s: a listener of the swap %s -> %s failed", e.name, old.revision, e.revision)
        if held:
            return None
        if idle:
            self._free(old)  # type: ignore[arg-type]
        return old

    def _retire(self, old: Entry) -> bool:
        """Mark ``old`` retired (the lock held); True when nothing is in flight on it, so the caller frees it now."""
        old.retired = True
        self.retiring.append(old)
        return old.inflight == 0

    def _free(self, e: Entry) -> None:
        def run() -> None:
            e.free(self.drain_s)
            with self._lock:
                if e in self.retiring:
                    self.retiring.remove(e)

        threading.Thread(target=run, name=f"nvrm-free-{e.name}", daemon=True).start()

    def all(self) -> list[Entry]:
        """Every entry: serving ones, then those still draining."""
        with self._lock:
            serving = list(self.entries.values())
            return serving + [e for e in self.retiring if not any(e is s for s in serving)]


class _ParseView:
    """What ``requests.parse_work`` reads of the service, for the model a request names."""

    def __init__(self, serving: Serving, entry: Entry):
        self.config, self.store, self.metrics = serving.config, serving.store, serving.metrics
        self.model, self.cache = entry.model, entry.cache


class MultiServing(Serving):
    """``Serving`` over several named models: each request is parsed by and admitted to the one it names."""

    def __init__(self, config: ServeConfig, names: list[str] | None = None, rest: Callable[[], list[tuple[str, Any]]] | None = None):
        super().__init__(config)
        self.names = names or [DEFAULT_NAME]
        self._rest = rest
        self.registry = Registry(config.drain_timeout_s)
        self.load_bundle: Callable[[str], Any] | None = None
        """How a swap loads a bundle; None: with the running model's settings (``model_swap.default_loader``)."""
        self.free_memory: Callable[[Any], int] = free_memory
        """Bytes free for a new model on a device (the swap's memory check; a test injects a figure)."""

    def entry_for(self, name: str, model, first: bool = False) -> Entry:
        """A new entry of ``model`` under ``name`` (the service's first shares its gauged caches)."""
        mb = 1024 * 1024
        caches = (self.cache, self.prefixes) if first else (
            ContextCache(int(self.config.context_cache_mb * mb), self._counter(self.metrics.context_cache)),
            PrefixCache(int(self.config.prefix_cache_mb * mb), self._counter(self.metrics.prefix_cache)),
        )
        return Entry(name, model, self.config, self.metrics, caches)

    def install(self, model) -> None:
        """Serve ``model`` under the first name, then load and serve the others."""
        first = self.entry_for(self.names[0], model, first=True)
        self.registry.add(first)
        for name, other in self._rest() if self._rest else ():
            self.registry.add(self.entry_for(name, other))
        self.point_default(first)

    def point_default(self, e: Entry) -> None:
        """``model`` / ``scheduler`` / the gauged caches follow the default model (the routes without a ``model``)."""
        self.cache, self.prefixes = e.cache, e.prefixes
        self.scheduler = e.scheduler
        self.model = e.model

    def for_payload(self, payload: Any) -> _ParseView:
        """The parse view of the model a request body names (``RequestError`` if it names an unknown one)."""
        name = payload.get("model") if isinstance(payload, dict) else None
        if name is not None and not isinstance(name, str):
            raise RequestError("request.model", "must be a string (a name from GET /v1/models)")
        return _ParseView(self, self.registry.current(name))

    def drain(self, seconds: float, *, wait: bool = True) -> bool:
        """``Serving.drain`` over every entry's scheduler."""
        schedulers = [e.scheduler for e in self.registry.all() if e.scheduler is not None]
        for s in schedulers:
            s.begin_drain(seconds)
        return all(s.stop(seconds) for s in schedulers) if wait else False

    def unpoint_default(self) -> None:
        """Let go of the default model while it is replaced (``--swap-mode replace``): every route answers 503 meanwhile."""
        self.model = self.scheduler = None  # type: ignore[assignment]

    async def handle(self, work: Work) -> Reply:
        """Score ``work`` on the entry its model names now; it stays in flight there until answered."""
        if (busy := self.not_ready()) is not None:
            return busy
        try:
            entry = self.registry.acquire(getattr(work, "model", None))
        except RequestError as e:
            return self.refused(e)
        try:
            return await self._handle_on(entry, work)
        finally:
            self.registry.release(entry)

    async def _handle_on(self, entry: Entry, work: Work) -> Reply:
        expected = getattr(work, "expect_revision", None)
        if expected is not None and expected != entry.revision:
            return Reply.error(ErrorCode.REVISION_MISMATCH,
                               f"expect_revision is {expected}, but model {entry.name!r} is at revision {entry.revision}")
        parsed_by = getattr(work, "fingerprint", None)
        if parsed_by is not None and parsed_by != entry.model.fingerprint:
            return Reply.error(ErrorCode.UNAVAILABLE,
                               f"model {entry.name!r} was swapped to another contract while this request was read; retry",
                               {"Retry-After": "1"})
        results = await self.results(work, entry.scheduler)
        if isinstance(results, Reply):
            return results
        m = entry.model
        rows = [{**item_dict(r), "model": entry.name, "model_revision": entry.revision} for r in results]
        body = {
            "results": rows,
            "model": {"name": entry.name, "revision": entry.revision, "path": str(m.path) if m.path else None},
            "contract": m.fingerprint,
            "replica": self.replica,
        }
        from ...protocol import INPUT_CODES

        failed_on_input = rows and all(r.get("error", {}).get("code") in INPUT_CODES for r in rows)
        return Reply(422 if failed_on_input else 200, body)

    def list_models(self) -> Reply:
        """``GET /v1/models``: each model's name, revision, contract, state and memory (draining revisions too)."""
        if (busy := self.not_ready()) is not None:
            return busy
        return Reply(200, {"default": self.names[0], "models": [e.describe() for e in self.registry.all()]})
