"""Swapping a served model under load: what ``PUT /v1/models/{name}`` (``model_routes``), ``--watch`` (``model_watch``) and
a Ray Serve replica's turn in a roll (``ray.rolling_swap``) run.

    PUT {"path": DIR} with the admin key ─► checks (key, name, --allow-dir, one swap at a time)
        (or {"repo": ORG/NAME, "revision": REV}: the bundle from the Hub cache, downloaded there if need be)
        ─► (a thread) verify the manifest ─► fits beside the old model? ─► load beside it ─► same contract?
        ─► warm up on one item ─► switch the pointer atomically ─► the old revision finishes what it admitted, then is freed

The memory check compares the new bundle's weights (their bytes in its safetensors headers, scaled as the
running revision's loaded bytes are to its own headers') with the free memory of the model's device (the
host's available RAM on the CPU). When it does not fit, the swap is refused, unless ``--swap-mode replace``:
then the old revision stops taking requests (503, Retry-After), drains, is freed, and the new one loads in
its place (should that fail, the old bundle is loaded again); the answer says which way it went.

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
import queue
import stat
import threading
from typing import Any, Callable

from ...errors import NvrmError, RequestError
from ...protocol import ADMIN_HEADER, ErrorCode
from ..batching.execution import FORWARD_LOCK
from ..http.messages import Reply
from .served import ServedModels

log = logging.getLogger(__name__)


def check_admin(models: ServedModels, key: str | None) -> Reply | None:
    """401 without a key, 403 with a wrong one (or when swaps are off); None when ``key`` is the admin key."""
    admin = models.config.admin_key
    if admin is None:
        return Reply.error(ErrorCode.FORBIDDEN, "model swaps are off on this server; start it with --admin-key-env")
    if not key:
        return Reply.error(ErrorCode.UNAUTHORIZED, f"a swap needs the admin key in the {ADMIN_HEADER} header")
    if not hmac.compare_digest(key.encode(), admin.encode()):
        return Reply.error(ErrorCode.FORBIDDEN, f"the {ADMIN_HEADER} header does not hold the admin key")
    return None


SEND = 'send {"path": "BUNDLE_DIR"} or {"repo": "ORG/NAME", "revision": "COMMIT"}'


def swap_body(raw: bytes) -> dict[str, Any]:
    """A swap request's JSON object (else ``RequestError``)."""
    try:
        body = json.loads(raw or b"{}")
    except RecursionError as e:
        raise RequestError("request", f"is nested too deeply; {SEND}") from e
    except ValueError as e:
        raise RequestError("request", f"is not JSON; {SEND}") from e
    if not isinstance(body, dict):
        raise RequestError("request", f"is not a JSON object; {SEND}")
    return body


def from_hub(body: dict[str, Any]) -> str:
    """The local folder of the hub bundle a swap body names (``repo`` at ``revision``), downloaded into the Hub cache
    if it is not there (runs in a thread); ``RequestError`` naming the repo and the reason when it cannot be had."""
    from ...bundle.hub import download_bundle, repo_id_problem
    from ...errors import DownloadError

    repo, revision = body.get("repo"), body.get("revision")
    if not isinstance(repo, str) or (why := repo_id_problem(repo)) is not None:
        shown = repr(repo[:100]) if isinstance(repo, str) else repr(repo)[:100]
        reason = why if isinstance(repo, str) else "must be a string"
        raise RequestError("request.repo", f"{shown} is not a Hub repo id like ORG/NAME ({reason}); {SEND}")
    if not isinstance(revision, str) or not revision:
        raise RequestError("request.revision", f"is missing: a swap from {repo} is pinned to a revision (a commit sha, tag or branch)")
    if "path" in body:
        raise RequestError("request", f"names both a path and a repo; {SEND}")
    try:
        return str(download_bundle(repo, revision=revision))
    except DownloadError as e:
        raise RequestError("request.repo", str(e), code=ErrorCode.HUB_UNAVAILABLE) from e


def allowed_path(models: ServedModels, body: dict[str, Any]) -> str:
    """The bundle folder a swap body (``swap_body``) names, resolved, if it lies under an ``--allow-dir`` (else ``RequestError``)."""
    path = body.get("path")
    if not isinstance(path, str) or not path:
        raise RequestError("request.path", f"is missing; {SEND}")
    if "\0" in path:
        raise RequestError("request.path", f"{path[:100]!r} holds a NUL byte, which no file path can hold")
    real = os.path.realpath(os.path.expanduser(path))
    if not any(real == d or real.startswith(d.rstrip(os.sep) + os.sep) for d in models.config.allow_dirs):
        raise RequestError("request.path", f"{path} is not under an --allow-dir of this server", code=ErrorCode.FORBIDDEN)
    if not os.path.isdir(real):
        raise RequestError("request.path", f"{path} is not a bundle directory")
    return real


def warm_up(model) -> None:
    """Score one synthetic item of the model's contract (a failure refuses the swap)."""
    from ...clip import Clip
    from ...synth.clips import moving_square

    c = model.contract
    n = max(2, math.ceil(c.candidate_seconds * c.sample_fps) + 1)
    context = None if c.no_context else Clip(moving_square(2, 64, 32, seed=1), fps=c.sample_fps)
    with FORWARD_LOCK:  # never beside a served forward (execution.FORWARD_LOCK says why)
        model.score("warm-up", context, Clip(moving_square(n, 64, 32, seed=2), fps=c.sample_fps))


def default_loader(models: ServedModels, name: str) -> Callable[[str], Any]:
    """Loads a bundle with the settings (and on the backend) the running model of ``name`` was loaded with."""
    from ...scoring.reward_model import RewardModel

    running = models.registry.current(name).model
    backend = getattr(running, "backend", "nvrm")
    url = getattr(getattr(running, "forward", None), "url", None) if backend == "vllm" else None
    return lambda path: RewardModel.from_pretrained(path, settings=running.settings, backend=backend, vllm_url=url)


MAX_BUNDLE_FILES = 10_000
"""The most entries a swapped bundle's folder may hold (a release bundle holds a few dozen)."""
_SPECIAL = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def special_file(path: str | os.PathLike) -> str | None:
    """Why the bundle folder ``path`` cannot be read safely, in one line: an entry (in it or its sub-folders, links
    followed) that is neither a regular file nor a folder, which opening or reading could block forever (a FIFO
    named ``*.safetensors``), or more than ``MAX_BUNDLE_FILES`` entries; None when every file is regular. Nothing
    is opened."""
    seen = 0
    for top, dirs, files in os.walk(path):
        for name in files:
            seen += 1
            if seen > MAX_BUNDLE_FILES:
                return f"{path} holds more than {MAX_BUNDLE_FILES} files; a bundle holds a few dozen"
            full = os.path.join(top, name)
            try:
                mode = os.stat(full).st_mode
            except OSError:  # a dangling link: nothing to block on (verification names it if the manifest lists it)
                continue
            kind = next((what for test, what in _SPECIAL if test(mode)), None)
            if kind is not None:
                return (f"{path}: {os.path.relpath(full, path)} is {kind}, not a regular file; a swap reads only regular files "
                        "(reading it could block forever)")
        seen += len(dirs)
    return None


def verified(path: str) -> None:
    """``RequestError`` unless ``path`` is a bundle with a manifest that verifies (runs in a thread); a folder holding
    anything but regular files (``special_file``) is refused before any of its files is opened."""
    from ...bundle.verify import verify_bundle

    from .weights import manifest_sha256

    if (why := special_file(path)) is not None:
        raise RequestError("request.path", why)
    if manifest_sha256(path) is None:
        raise RequestError("request.path", f"{path} has no RELEASE_MANIFEST.json or worl-bundle.json; a swap loads only verified bundles")
    try:
        verify_bundle(path)
    except NvrmError as e:
        raise RequestError("request.path", f"{path} fails verification: {e}") from e


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def memory_shortfall(models: ServedModels, name: str, path: str) -> str | None:
    """None when the bundle at ``path`` fits beside the revision serving ``name``; else why not, in one line."""
    from .weights import bundle_weight_bytes

    old = models.registry.current(name)
    declared = bundle_weight_bytes(path)
    own = bundle_weight_bytes(old.path) if old.path else 0
    need = int(declared * old.memory / own) if own and old.memory else declared  # as loaded (dtype), like the running one
    device = getattr(old.model, "device", "cpu")
    free = int(models.free_memory(device))
    if need <= free:
        return None
    where = "available RAM" if not str(device).startswith("cuda") else f"free memory on {device}"
    return (f"model {name!r}: {path} needs about {_gib(need)} beside the running revision ({_gib(old.memory)}), and the {where} "
            f"is {_gib(free)}; free memory, or start the server with --swap-mode replace (drains the old revision, then loads)")


def load_checked(models: ServedModels, name: str, path: str, *, fingerprint: str | None = None, load: Callable[[str], Any] | None = None,
                 verify: bool = True):
    """Verify (unless done: ``verify=False``), load, check the contract (``fingerprint``: the running model's) and warm up
    a new revision of ``name`` (runs in a thread)."""
    if verify:
        verified(path)
    if fingerprint is None or load is None:
        old = models.registry.current(name)
        fingerprint, load = old.model.fingerprint, models.load_bundle or default_loader(models, name)
    model = load(path)
    try:
        if model.fingerprint != fingerprint and not models.config.allow_contract_change:
            raise RequestError("request.path", f"{path} has contract {model.fingerprint[:16]}, "
                               f"but model {name!r} serves {fingerprint[:16]}; "
                               "start the server with --allow-contract-change to allow it", code=ErrorCode.CONTRACT_MISMATCH)
        warm_up(model)
    except BaseException:
        model.close()
        raise
    return model


def _replace(models: ServedModels, name: str, path: str):
    """``--swap-mode replace`` (runs in a thread): stop admitting to ``name``, drain and free its revision, then load
    ``path``; should that fail, load the old bundle again and raise. Returns (the new model, what the answer says)."""
    old = models.registry.current(name)
    if old.path is None:
        raise RequestError("request.path", f"model {name!r} was not loaded from a folder, so --swap-mode replace could not "
                           "load it again should the new bundle fail; swap it beside (free memory)")
    fingerprint, load = old.model.fingerprint, models.load_bundle or default_loader(models, name)
    models.registry.hold(name)
    if name == models.names[0]:
        models.unpoint_default()
    if not models.registry.drained(old, models.config.drain_timeout_s):
        log.warning("model %s: revision %s did not drain in time; loading %s anyway", name, old.digest, path)
    try:
        model = load_checked(models, name, path, fingerprint=fingerprint, load=load, verify=False)
    except BaseException as e:
        try:
            back = load(str(old.path))
        except BaseException:
            log.exception("model %s: the old bundle %s could not be loaded again", name, old.path)
            raise
        models.registry.add(models.entry_for(name, back))
        if name == models.names[0]:
            models.point_default(models.registry.current(name))
        if isinstance(e, RequestError):
            raise RequestError(e.source, f"{e.reason} (--swap-mode replace: revision {old.digest[:16]} was loaded again)",
                               e.status, e.code) from e
        raise
    note = (f"--swap-mode replace: revision {old.digest} was drained and freed before {path} loaded; "
            f"requests for {name!r} got 503 meanwhile")
    return model, note


class _SwapThread:
    """The one daemon thread that runs the swaps' blocking steps (verify, load, warm up), each in turn: a hung file
    read there never holds the server's exit (``asyncio.to_thread``'s pool is joined when the process ends), and every
    load allocates from the same malloc arena (a thread per step spread the loads' freed fragments over all arenas)."""

    def __init__(self) -> None:
        self._jobs: "queue.SimpleQueue[Callable[[], None]]" = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def submit(self, job: Callable[[], None]) -> None:
        """Run ``job`` after those submitted before it."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="nvrm-swap", daemon=True)
                self._thread.start()
        self._jobs.put(job)

    def _loop(self) -> None:
        while True:
            self._jobs.get()()


_SWAP_THREAD = _SwapThread()


async def in_daemon_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` on the swaps' daemon thread (``_SwapThread``), awaited."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if done.done():
            return
        if ok:
            done.set_result(value)
        else:
            done.set_exception(value)

    def run() -> None:
        try:
            out: tuple[bool, Any] = (True, fn(*args))
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine
            out = (False, e)
        try:
            loop.call_soon_threadsafe(settle, *out)
        except RuntimeError:  # the loop has closed: nobody awaits it any more
            pass

    _SWAP_THREAD.submit(run)
    return await done


async def swap(models: ServedModels, name: str, path: str) -> Reply:
    """Load ``path`` beside the model serving ``name`` and switch to it; 409 while another swap runs."""
    if not models.registry.swapping.acquire(blocking=False):
        return Reply.error(ErrorCode.SWAP_IN_PROGRESS, "another model swap is running; retry once it has finished")
    try:
        old = models.registry.current(name)
        await in_daemon_thread(verified, path)
        short = await in_daemon_thread(memory_shortfall, models, name, path)
        replace = models.config.swap_mode == "replace"
        if short is not None and not replace:
            return Reply.error(ErrorCode.TOO_LARGE, short, status=507)
        note = None
        if replace:
            model, note = await in_daemon_thread(_replace, models, name, path)
        else:
            model = await in_daemon_thread(lambda: load_checked(models, name, path, verify=False))
        new = models.entry_for(name, model)
        models.registry.add(new)
        if name == models.names[0]:
            models.point_default(new)
        log.info("model %s: swapped revision %s -> %s%s", name, old.digest, new.digest, f" ({note})" if note else "")
        return Reply(200, {"name": name, "revision": new.digest, "previous_revision": old.digest, "contract": model.fingerprint,
                           "swap_mode": "replace" if replace else "beside", **({"note": note} if note else {})})
    except RequestError as e:
        return models.refused(e)
    except NvrmError as e:
        return Reply.error(ErrorCode.BAD_REQUEST, f"model {name!r}: {path} could not be loaded: {e}")
    finally:
        models.registry.swapping.release()
