"""``nvrm serve --ray``: the same app as Ray Serve replicas.

Each replica is a Ray actor holding one ``RewardModel`` and serving the very
app ``create_app`` builds (same endpoints, auth, limits, batching and
shared-context cache, per replica). Ray Serve's proxy routes each HTTP request
to a replica; a group is one request, so it is scored on one replica.

Requests that name one context go to the replica that holds it: nvrm's client
sends the context's content hash in Ray Serve's ``serve_multiplexed_model_id``
header (``ROUTE_HEADER``), and each replica registers the hashes it has answered
for (never after a miss) as multiplexed "models", so the proxy prefers that
replica for them. The
upload, the presence check and the scoring requests of one context all carry
it, so the context store, the prepared-context cache and the kept prefill of
that context live on one replica.

With ``--admin-key-env``, ``PUT /v1/models/NAME`` rolls a swap over the replicas, one at a time
(``rolling_swap``): the others keep serving meanwhile, and a replica Ray Serve starts later loads what is live.

    nvrm serve --model DIR --ray --replicas 4 --gpus-per-replica 1 [--ray-address auto]
"""

from __future__ import annotations

import dataclasses
import signal
import sys
import threading

from ...errors import InputError
from ...protocol import ROUTE_HEADER


def _require_serve():
    try:
        import ray
        from ray import serve
    except ImportError as e:  # pragma: no cover - installed with the ray extra
        raise InputError("--ray", "Ray Serve is not installed; pip install 'nvrm[ray]'") from e
    return ray, serve


def _with_replica_id(config, serve):
    """``config`` naming this Ray Serve replica (answered as ``replica_id`` on enqueue) unless ``--replica-id`` did."""
    if config.replica_id is not None:
        return config
    try:
        rid = serve.get_replica_context().replica_id.unique_id
    except (AttributeError, RuntimeError):  # another Ray version's context: no identity to answer
        return config
    return dataclasses.replace(config, replica_id=f"nvrm-{rid}")


def build_deployment(specs: list[tuple[str, str]], settings, config, *, replicas: int, gpus_per_replica: float,
                     cpus_per_replica: float, swaps=None):
    """A bound Ray Serve application: ``replicas`` copies of the service, each loading its bundles once. ``specs``:
    ``[(name, folder)]``, the first the default (``models.served.parse_model_specs`` of ``--model``). ``swaps``: the
    handle of a ``rolling_swap.RollingSwap`` actor, with which the replicas roll swaps (``--admin-key-env``)."""
    _, serve = _require_serve()
    from ...scoring.reward_model import RewardModel
    from ..app import create_app
    from ..models.served import NamedModels

    specs = list(specs)

    @serve.deployment(
        name="nvrm",
        num_replicas=replicas,
        ray_actor_options={"num_gpus": gpus_per_replica, "num_cpus": cpus_per_replica},
        max_ongoing_requests=max(8, config.max_queue_items),
    )
    @serve.ingress()
    class NvrmReplica:
        """One replica: loads the bundle once, then builds the service app around it (in the replica)."""

        def __init__(self, swaps=None) -> None:  # every model loaded before Serve routes traffic here
            import ray

            self.config, self.swaps = _with_replica_id(config, serve), swaps
            if swaps is not None and self.config.replica_id is None:  # a roll tells replicas apart by their ids
                import uuid

                self.config = dataclasses.replace(self.config, replica_id=f"nvrm-{uuid.uuid4().hex[:12]}")
            self.specs = specs
            if swaps is not None:  # what is live now: a replica started after a swap (or during one) loads that
                live = ray.get(swaps.join.remote(self.config.replica_id))
                self.specs = [(name, live.get(name, where)) for name, where in specs]
            self.models = {where: RewardModel.from_pretrained(where, settings=settings) for _, where in self.specs}

        @serve.multiplexed(max_num_models_per_replica=4096)
        async def hold(self, ref: str) -> str:
            """Registers ``ref`` as held here (the proxy routes its later requests to this replica)."""
            return ref

        def __serve_build_asgi_app__(self):
            served = NamedModels(self.specs, self.models.__getitem__, loaded=True)
            rolling = {}
            if self.swaps is not None:
                from .rolling_swap import poll, rolling_swap

                rid, swaps = self.config.replica_id, self.swaps
                rolling = {"swap": rolling_swap(swaps, rid), "background": [lambda models: poll(swaps, rid, models)]}
            app = create_app(served, self.config, **rolling)
            replica = self

            @app.middleware("http")
            async def route_by_context(request, call_next):
                response = await call_next(request)
                if request.headers.get(ROUTE_HEADER) and response.status_code < 400:
                    # only once this replica holds the context (an answered upload, presence check or score):
                    # a 404 presence check or a 409 context_unknown registering it would send its later
                    # requests here to miss again
                    await replica.hold(serve.get_multiplexed_model_id())
                return response

            return app

    return NvrmReplica.bind(swaps)


def serve_on_ray(
    specs: list[tuple[str, str]],
    settings,
    config,
    *,
    replicas: int = 1,
    gpus_per_replica: float = 0.0,
    cpus_per_replica: float = 1.0,
    address: str | None = None,
) -> int:
    """Start (or join) Ray, deploy the replicas of the models ``specs`` (``[(name, folder)]``, the first the default) on
    ``config.host:config.port``, serve until SIGTERM/SIGINT."""
    ray, serve = _require_serve()
    if replicas < 1:
        raise InputError(f"--replicas {replicas}", "must be at least 1")
    from ...bundle import resolve_bundle

    resolved = [(name, str(resolve_bundle(where, settings.revision))) for name, where in specs]
    if config.job_store != "memory":  # unreachable: one line naming the URL and exit 2, before any replica starts
        from ..jobs.redis_store import connect

        connect(config.job_store).close()
    if not ray.is_initialized():
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False, include_dashboard=False)
    swaps = None
    if config.admin_key is not None:  # PUT /v1/models/NAME rolls over the replicas (nvrm.serve.ray.rolling_swap)
        from .rolling_swap import RollingSwap

        swaps = ray.remote(num_cpus=0)(RollingSwap).remote({name: where for name, where in resolved})
    serve.start(http_options={"host": config.host, "port": config.port})
    serve.run(
        build_deployment(resolved, settings, config, replicas=replicas, gpus_per_replica=gpus_per_replica,
                         cpus_per_replica=cpus_per_replica, swaps=swaps),
        name="nvrm",
        route_prefix="/",
    )
    print(f"nvrm serve (ray, {replicas} replica(s)): listening on http://{config.host}:{config.port}", file=sys.stderr, flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(0.5):
        pass
    serve.shutdown()
    ray.shutdown()
    print("nvrm serve: stopped", file=sys.stderr, flush=True)
    return 0

