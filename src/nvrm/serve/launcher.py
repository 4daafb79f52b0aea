"""The server's life in one call: ``launch(model_or_loader, config)`` runs the app on uvicorn until
SIGTERM/SIGINT, drains once and exits cleanly. ``nvrm serve`` only builds the config and calls it.

    from nvrm.serve import ServeConfig, launch
    launch(lambda: RewardModel.from_pretrained("bundle"), ServeConfig(port=8000))

A signal begins the service's one drain (``Serving.drain``) at once: new work is refused, what is
open is answered by ``drain_timeout_s``; uvicorn then finishes the open connections, the app's
shutdown waits for the same drain, and ``launch`` returns.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from typing import Any

from ..errors import ServerFailed
from .config import ServeConfig


def _server(config: Any, on_signal) -> Any:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, but SIGTERM/SIGINT start the drain at once and end in a clean exit
        (uvicorn would re-raise the signal and kill the process once it finished)."""

        def handle_exit(self, sig, frame):
            on_signal()
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self):
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    return Server(config)


def launch(model_or_loader: Any, config: ServeConfig = ServeConfig(), *, announce: bool = True) -> None:
    """Serve ``model_or_loader`` (a ``RewardModel``, or a callable that loads one in the background) on
    ``config.host:config.port`` until SIGTERM/SIGINT; return after the drain, every request answered.

    Raises ``ServerFailed`` when the model could not be loaded. If a forward pass is still running past
    the drain, the process leaves at once (exit 0) instead of tearing the interpreter down around it.
    A model that ``launch`` loaded is closed on the way out; a ``RewardModel`` handed in stays open."""
    import uvicorn

    from .app import create_app
    from .admission.memory import tune
    from .http.middleware import answer_overload_as_json

    tune()  # before the model loads: large buffers mapped on their own, few arenas (nvrm.serve.admission.memory)
    fatal: list[str] = []
    server: Any = None

    def on_fatal(message: str) -> None:
        fatal.append(message)
        if server is not None:
            server.should_exit = True

    app = create_app(model_or_loader, config, on_fatal=on_fatal)
    state = app.state.nvrm
    answer_overload_as_json()
    server = _server(uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        log_level="info" if logging.getLogger().level <= logging.INFO else "warning",
        access_log=False,
        # the scheduler answers what is still open at the drain deadline; uvicorn waits a
        # little longer so those answers are written before it closes the connections
        timeout_graceful_shutdown=config.drain_timeout_s + 2,
        limit_concurrency=config.max_connections,
        lifespan="on",
    ), on_signal=lambda: state.drain(config.drain_timeout_s, wait=False))
    if announce:
        print(f"nvrm serve: listening on http://{config.host}:{config.port} (model loading; see /readyz)", file=sys.stderr, flush=True)
    server.run()
    if fatal:
        raise ServerFailed(fatal[0])
    if announce:
        print("nvrm serve: stopped", file=sys.stderr, flush=True)
    if not state.drain(0):  # the app's shutdown waited drain_timeout_s already
        # a forward pass is still running past the drain: leave without tearing down the
        # interpreter around it (that is what crashed with SIGSEGV), every request answered
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    if state.model is not None and state.model is not model_or_loader:  # what launch loaded; a model handed in stays the caller's
        state.model.close()
