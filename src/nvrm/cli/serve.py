"""nvrm serve: the reward service on uvicorn."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import sys

from ..errors import InputError


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="bundle directory (or Hub repo id)")
    p.add_argument("--revision", help="Hub revision to pin when --model is a repo id")
    p.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--no-verify", action="store_true", help="skip the manifest sha256 check")
    p.add_argument("--compile", nargs="?", const=True, default=False, metavar="MODE", help="torch.compile the language model")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--allow-dir", action="append", default=[], metavar="DIR", help="folder {\"path\"} inputs may read (repeatable)")
    p.add_argument("--api-key-env", metavar="NAME", help="require 'Authorization: Bearer $NAME' on /v1/* and /metrics")
    p.add_argument("--max-batch-tokens", type=int, default=16384, metavar="N", help="tokens per forward pass across requests")
    p.add_argument("--max-batch-items", type=int, default=64, metavar="N", help="items per forward pass (1 = no cross-request batching)")
    p.add_argument("--max-wait-ms", type=float, default=5.0, metavar="M", help="how long a ready item waits for others to join its batch")
    p.add_argument("--max-queue", type=int, default=1024, metavar="N", help="items in flight before new requests get 503")
    p.add_argument("--max-body-mb", type=float, default=64.0, metavar="MB", help="request body size limit")
    p.add_argument("--timeout", type=float, default=120.0, metavar="S", help="per-request timeout (504 after)")
    p.add_argument("--drain-timeout", type=float, default=60.0, metavar="S", help="on SIGTERM, how long in-flight requests may finish")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _server_class():
    import contextlib
    import signal
    import threading

    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, but SIGTERM/SIGINT end in a clean exit after the drain
        (uvicorn would re-raise the signal and kill the process once it finished)."""

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
    import uvicorn

    from ..scoring import RewardModel
    from ..serve.app import create_app
    from ..serve.config import ServeConfig

    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            raise InputError(f"--api-key-env {args.api_key_env}", "that environment variable is empty or unset")
    config = ServeConfig(
        host=args.host,
        port=args.port,
        allow_dirs=tuple(args.allow_dir),
        api_key=api_key,
        max_batch_tokens=args.max_batch_tokens,
        max_batch_items=args.max_batch_items,
        max_wait_ms=args.max_wait_ms,
        max_queue_items=args.max_queue,
        max_body_bytes=int(args.max_body_mb * 1024 * 1024),
        request_timeout_s=args.timeout,
        drain_timeout_s=args.drain_timeout,
    )
    if not _is_loopback(args.host) and api_key is None:
        print(f"nvrm: warning: serving on {args.host} without --api-key-env: anyone who can reach it can use it", file=sys.stderr)

    def loader():
        return RewardModel.from_pretrained(
            args.model,
            revision=args.revision,
            device=args.device,
            verify=not args.no_verify,
            max_batch_tokens=args.max_batch_tokens,
            compile=args.compile,
        )

    fatal: list[str] = []
    server: uvicorn.Server | None = None

    def on_fatal(message: str) -> None:
        fatal.append(message)
        if server is not None:
            server.should_exit = True

    app = create_app(loader, config, on_fatal=on_fatal)
    server = _server_class()(
        uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            log_level="info" if logging.getLogger().level <= logging.INFO else "warning",
            access_log=False,
            timeout_graceful_shutdown=args.drain_timeout,
            lifespan="on",
        )
    )
    print(f"nvrm serve: listening on http://{args.host}:{args.port} (model loading; see /readyz)", file=sys.stderr, flush=True)
    server.run()
    if fatal:
        print(f"nvrm: error: {fatal[0]}", file=sys.stderr)
        return 2
    print("nvrm serve: stopped", file=sys.stderr)
    return 0
