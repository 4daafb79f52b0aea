"""``GET /v1/models`` and ``PUT /v1/models/{name}``: list the served models, and swap one under load.

    PUT {"path": DIR} with the admin key ─► checks (key, name, --allow-dir, one swap at a time)
        ─► (a thread) verify the manifest ─► load beside the old model ─► same contract? ─► warm up on one item
        ─► switch the pointer atomically ─► the old revision finishes what it admitted, then is freed

Every refusal is a one-line error and leaves what is served as it was. The admin key travels in the
``X-Nvrm-Admin-Key`` header (the ``Authorization`` bearer stays the scoring key's, checked as for any /v1 route).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import os
from typing import Any, Callable

from fastapi import APIRouter, Request

from ..errors import NvrmError, RequestError
from ..protocol import ErrorCode
from .execution import FORWARD_LOCK
from .models import MultiServing
from .serving import Reply

log = logging.getLogger(__name__)

ADMIN_HEADER = "x-nvrm-admin-key"
"""The request header holding the admin key (``--admin-key-env``)."""


def check_admin(serving: MultiServing, key: str | None) -> Reply | None:
    """401 without a key, 403 with a wrong one (or when swaps are off); None when ``key`` is the admin key."""
    admin = serving.config.admin_key
    if admin is None:
        return Reply.error(ErrorCode.FORBIDDEN, "model swaps are off on this server; start it with --admin-key-env")
    if not key:
        return Reply.error(ErrorCode.UNAUTHORIZED, f"a swap needs the admin key in the {ADMIN_HEADER} header")
    if not hmac.compare_digest(key.encode(), admin.encode()):
        return Reply.error(ErrorCode.FORBIDDEN, f"the {ADMIN_HEADER} header does not hold the admin key")
    return None


def allowed_path(serving: MultiServing, raw: bytes) -> str:
    """The bundle folder a swap body names, resolved, if it lies under an ``--allow-dir`` (else ``RequestError``)."""
    try:
        body = json.loads(raw or b"{}")
    except ValueError as e:
        raise RequestError("request", 'is not JSON; send {"path": "BUNDLE_DIR"}') from e
    path = body.get("path") if isinstance(body, dict) else None
    if not isinstance(path, str) or not path:
        raise RequestError("request.path", 'is missing; send {"path": "BUNDLE_DIR"}')
    real = os.path.realpath(os.path.expanduser(path))
    if not any(real == d or real.startswith(d.rstrip(os.sep) + os.sep) for d in serving.config.allow_dirs):
        raise RequestError("request.path", f"{path} is not under an --allow-dir of this server", code=ErrorCode.FORBIDDEN)
    if not os.path.isdir(real):
        raise RequestError("request.path", f"{path} is not a bundle directory")
    return real


def warm_up(model) -> None:
    """Score one synthetic item of the model's contract (a failure refuses the swap)."""
    from ..clip import Clip
    from ..synth.clips import moving_square

    c = model.contract
    n = max(2, math.ceil(c.candidate_seconds * c.sample_fps) + 1)
    context = None if c.no_context else Clip(moving_square(2, 64, 32, seed=1), fps=c.sample_fps)
    with FORWARD_LOCK:  # never beside a served forward (execution.FORWARD_LOCK says why)
        model.score("warm-up", context, Clip(moving_square(n, 64, 32, seed=2), fps=c.sample_fps))


def default_loader(serving: MultiServing, name: str) -> Callable[[str], Any]:
    """Loads a bundle with the settings the running model of ``name`` was loaded with."""
    from ..scoring.reward_model import RewardModel

    settings = serving.registry.current(name).model.settings
    return lambda path: RewardModel.from_pretrained(path, settings=settings)


def load_checked(serving: MultiServing, name: str, path: str):
    """Verify, load, check the contract and warm up a new revision of ``name`` (runs in a thread)."""
    from ..bundle.verify import verify_bundle

    from .models import manifest_sha256

    if manifest_sha256(path) is None:
        raise RequestError("request.path", f"{path} has no RELEASE_MANIFEST.json or worl-bundle.json; a swap loads only verified bundles")
    try:
        verify_bundle(path)
    except NvrmError as e:
        raise RequestError("request.path", f"{path} fails verification: {e}") from e
    old = serving.registry.current(name)
    model = (serving.load_bundle or default_loader(serving, name))(path)
    try:
        if model.fingerprint != old.model.fingerprint and not serving.config.allow_contract_change:
            raise RequestError("request.path", f"{path} has contract {model.fingerprint[:16]}, "
                               f"but model {name!r} serves {old.model.fingerprint[:16]}; "
                               "start the server with --allow-contract-change to allow it", code=ErrorCode.CONTRACT_MISMATCH)
        warm_up(model)
    except BaseException:
        model.close()
        raise
    return model


async def swap(serving: MultiServing, name: str, path: str) -> Reply:
    """Load ``path`` beside the model serving ``name`` and switch to it; 409 while another swap runs."""
    if not serving.registry.swapping.acquire(blocking=False):
        return Reply.error(ErrorCode.SWAP_IN_PROGRESS, "another model swap is running; retry once it has finished")
    try:
        old = serving.registry.current(name)
        model = await asyncio.to_thread(load_checked, serving, name, path)
        new = serving.entry_for(name, model)
        serving.registry.add(new)
        if name == serving.names[0]:
            serving.point_default(new)
        log.info("model %s: swapped revision %s -> %s", name, old.revision, new.revision)
        return Reply(200, {"name": name, "revision": new.revision, "previous_revision": old.revision, "contract": model.fingerprint})
    except RequestError as e:
        return serving.refused(e)
    except NvrmError as e:
        return Reply.error(ErrorCode.BAD_REQUEST, f"model {name!r}: {path} could not be loaded: {e}")
    finally:
        serving.registry.swapping.release()


def models_router(serving: MultiServing) -> APIRouter:
    """``GET /v1/models`` and the admin's ``PUT /v1/models/{name}``."""
    router = APIRouter()
    from .routes import response

    @router.get("/v1/models", summary="The served models: name, revision (manifest sha256), contract, state, memory")
    async def list_models():
        return response(serving.list_models())

    @router.put("/v1/models/{name}", summary='Swap a model under load: {"path": BUNDLE_DIR} under --allow-dir, with the admin key')
    async def put_model(name: str, request: Request):
        if (refused := check_admin(serving, request.headers.get(ADMIN_HEADER))) is not None:
            return response(refused)
        if (busy := serving.not_ready()) is not None:
            return response(busy)
        try:
            serving.registry.current(name)
            path = allowed_path(serving, await request.body())
        except RequestError as e:
            return response(serving.refused(e))
        return response(await swap(serving, name, path))

    return router
