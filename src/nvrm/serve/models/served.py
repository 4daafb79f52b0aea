"""The served models as one object: their names, the registry, the default model the name-less routes follow,
and how a swap loads and sizes a bundle (``ServedModels``). ``--model`` values become one ``[(name, dir)]``
(``parse_model_specs``) that travels unchanged from the command line to every replica (``NamedModels``).
"""

from __future__ import annotations

from typing import Any, Callable

from ...errors import ConfigError, InputError
from ..batching.contexts import ContextCache, PrefixCache
from ..config import ServeConfig
from ..http.messages import Reply, refusal
from ...protocol import ErrorCode
from .registry import ModelEntry, Registry
from .weights import free_memory

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


class NamedModels:
    """The models of ``[(name, dir)]`` (``parse_model_specs``), loaded by ``load``: called, it loads the first;
    ``create_app`` installs the rest through ``rest()``. ``loaded``: ``load`` only looks up models already in memory
    (a Ray Serve replica's), so the app installs them at start instead of in a background thread."""

    def __init__(self, specs: list[tuple[str, str]], load: Callable[[str], Any], *, loaded: bool = False):
        self.specs, self.load, self.loaded = list(specs), load, loaded

    @property
    def names(self) -> list[str]:
        """The models' names, the default first."""
        return [n for n, _ in self.specs]

    def __call__(self):
        return self.load(self.specs[0][1])

    def rest(self) -> list[tuple[str, Any]]:
        """The other models, loaded in order."""
        return [(name, self.load(where)) for name, where in self.specs[1:]]


class ServedModels:
    """Every served model by name (``registry``), and the default one (the first name) that routes naming no model
    follow: ``model``, ``scheduler`` and its gauged caches point at the entry serving it (None while it loads, or
    while ``--swap-mode replace`` replaces it)."""

    def __init__(self, config: ServeConfig, metrics, names: list[str] | None = None, rest: Callable[[], list[tuple[str, Any]]] | None = None):
        self.config, self.metrics = config, metrics
        self.names = names or [DEFAULT_NAME]
        self._rest = rest
        self.registry = Registry(config.drain_timeout_s)
        self.model: Any = None
        self.scheduler: Any = None
        self.load_error: str | None = None
        """Why the models could not be loaded (every route answers 503 with it)."""
        self.load_bundle: Callable[[str], Any] | None = None
        """How a swap loads a bundle; None: with the running model's settings (``model_swap.default_loader``)."""
        self.free_memory: Callable[[Any], int] = free_memory
        """Bytes free for a new model on a device (the swap's memory check; a test injects a figure)."""
        self.cache, self.prefixes = self._caches()

    def _caches(self) -> tuple[ContextCache, PrefixCache]:
        mb, c, m = 1024 * 1024, self.config, self.metrics
        return (ContextCache(int(c.context_cache_mb * mb), m.lookups(m.context_cache)),
                PrefixCache(int(c.prefix_cache_mb * mb), m.lookups(m.prefix_cache)))

    def entry_for(self, name: str, model, first: bool = False) -> ModelEntry:
        """A new entry of ``model`` under ``name`` (the service's first shares its gauged caches)."""
        return ModelEntry(name, model, self.config, self.metrics, (self.cache, self.prefixes) if first else self._caches())

    def install(self, model) -> None:
        """Serve ``model`` under the first name, then load and serve the others."""
        first = self.entry_for(self.names[0], model, first=True)
        self.registry.add(first)
        for name, other in self._rest() if self._rest else ():
            self.registry.add(self.entry_for(name, other))
        self.point_default(first)

    def point_default(self, e: ModelEntry) -> None:
        """``model`` / ``scheduler`` / the gauged caches follow the default model (the routes without a ``model``)."""
        self.cache, self.prefixes = e.cache, e.prefixes
        self.scheduler = e.scheduler
        self.model = e.model

    def unpoint_default(self) -> None:
        """Let go of the default model while it is replaced (``--swap-mode replace``): every route answers 503 meanwhile."""
        self.model = self.scheduler = None

    def drain(self, seconds: float, *, wait: bool = True) -> bool:
        """The service's one drain, over every entry's scheduler: refuse new work at once, answer what is still open
        "shutting down" after ``seconds``, and (``wait``) wait as long for the scorers to stop. Idempotent: the first call
        starts it (a signal, or the app's shutdown), later ones only wait. True once the scorers have stopped (or never
        ran); False without ``wait``, or while a forward pass is still running after ``seconds``."""
        schedulers = [e.scheduler for e in self.registry.all() if e.scheduler is not None]
        for s in schedulers:
            s.begin_drain(seconds)
        return all(s.stop(seconds) for s in schedulers) if wait else False

    def not_ready(self) -> Reply | None:
        """503 (with why, or "loading") while the default model is not served; None once it is."""
        if self.model is None:
            return Reply.error(ErrorCode.NOT_READY, self.load_error or "model is loading", {"Retry-After": "2"})
        return None

    def refused(self, e: InputError) -> Reply:
        """A request refused before any work (``http.messages.refusal``), counted by its code."""
        reply = refusal(e)
        self.metrics.rejected.labels(reason=reply.body["error"]["code"]).inc()
        return reply

    def listing(self) -> Reply:
        """``GET /v1/models``: each model's name, revision (its digest), contract, state and memory (draining ones too)."""
        if (busy := self.not_ready()) is not None:
            return busy
        return Reply(200, {"default": self.names[0], "models": [e.describe() for e in self.registry.all()]})
