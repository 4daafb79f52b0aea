"""``nvrm serve``: the reward service on uvicorn, or as Ray Serve replicas (``--ray``)."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import sys

from ..errors import ConfigError


def add_args(p: argparse.ArgumentParser) -> None:
    """Flags of ``nvrm serve``: model loading, every :class:`ServeConfig` field (generated) and the Ray Serve options."""
    from ..serve.config import ServeConfig
    from .model_flags import add_model_args
    from .options import add_dataclass_args, add_ray_args

    add_model_args(p)
    add_dataclass_args(p, ServeConfig, group="service")
    ray = add_ray_args(p, what="replicas on one machine or a cluster", replica="the same app as Ray Serve replicas")
    ray.add_argument("--cpus-per-replica", type=float, default=1.0, help="CPUs reserved per replica")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def config_from_args(args: argparse.Namespace):
    """The ``ServeConfig`` the flags describe, with the bearer token read from ``--api-key-env``."""
    from ..serve.config import ServeConfig
    from .options import dataclass_from_args

    config = dataclass_from_args(args, ServeConfig)
    if config.api_key_env:
        key = os.environ.get(config.api_key_env)
        if not key:
            raise ConfigError(f"--api-key-env {config.api_key_env}: that environment variable is empty or unset")
        config = ServeConfig(**{**config.__dict__, "api_key": key})
    if not _is_loopback(config.host) and config.api_key is None:
        print(f"nvrm: warning: serving on {config.host} without --api-key-env: anyone who can reach it can use it", file=sys.stderr)
    return config


def _server_class():
    import contextlib
    import signal
    import threading

    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, but SIGTERM/SIGINT start the drain at once and end in a clean exit
        (uvicorn would re-raise the signal and kill the process once it finished)."""

        on_signal = None

        def handle_exit(self, sig, frame):
            if self.on_signal is not None:
                self.on_signal()
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

    return Server


def run(args: argparse.Namespace) -> int:
    """Load the model in the background and serve until SIGTERM/SIGINT; exit 0 after the drain."""
    from .model_flags import settings_from_args

    config = config_from_args(args)
    settings = settings_from_args(args)
    if args.ray:
        from ..serve.ray_serve import serve_on_ray

        return serve_on_ray(args.model, settings, config, replicas=args.replicas, gpus_per_replica=args.gpus_per_replica,
                            cpus_per_replica=args.cpus_per_replica, address=args.ray_address)
    import uvicorn

    from ..scoring.reward_model import RewardModel
    from ..serve.app import create_app
    from ..serve.memory import tune

    tune()  # before the model loads: large buffers mapped on their own, few arenas (nvrm.serve.memory)

    fatal: list[str] = []
    server: uvicorn.Server | None = None

    def loader():
        return RewardModel.from_pretrained(args.model, settings=settings)

    def on_fatal(message: str) -> None:
        fatal.append(message)
        if server is not None:
            server.should_exit = True

    app = create_app(loader, config, on_fatal=on_fatal)
    state = app.state.nvrm
    from ..serve.middleware import answer_overload_as_json

    answer_overload_as_json()
    server = _server_class()(
        uvicorn.Config(
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
        )
    )
    server.on_signal = lambda: state.scheduler.begin_drain(config.drain_timeout_s) if state.scheduler else None
    print(f"nvrm serve: listening on http://{config.host}:{config.port} (model loading; see /readyz)", file=sys.stderr, flush=True)
    server.run()
    if fatal:
        print(f"nvrm: error: {fatal[0]}", file=sys.stderr)
        return 2
    print("nvrm serve: stopped", file=sys.stderr, flush=True)
    if state.scheduler is not None and not state.scheduler.stop(0):
        # a forward pass is still running past the drain: leave without tearing down the
        # interpreter around it (that is what crashed with SIGSEGV), every request answered
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    if state.model is not None:
        state.model.close()
    return 0
