"""``nvrm refresh --serve URL``: after a passed gate and its export, swap the exported bundle into a running
``nvrm serve`` through its admin route (``PUT /v1/models/{name}`` with the admin key, ``nvrm.serve.models.model_swap``).

Every reward the server gives from then on carries the new revision, and so does every row its
``--record`` writes (each row stamps the revision that scored it). The cycle keeps what it did in
``CYCLE/export/swap.json`` (server, model, previous and new revision); a cycle run again does not swap twice.

A swap is recorded only once verified: the server's answer names the revision asked for (the sha256 of the
bundle's manifest) and a ``GET /v1/models`` after it lists that revision serving. A server that is not an
nvrm serve (HTML, a JSON list, a lying or a 300 MB answer) gets a one-line ``RefreshError``; at most
``MAX_ANSWER_BYTES`` of any answer is read.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..errors import ConfigError, RefreshError
from ..protocol import ADMIN_HEADER


def _base(url: str) -> str:
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


MAX_ANSWER_BYTES = 1 << 20
"""The most bytes of a server's answer read (a model listing or a swap's answer is a few hundred): a larger one is
refused unread, never held whole."""


def _line(value: Any, n: int) -> str:
    """``value`` as text on one line, at most ``n`` characters (what a server sends is not trusted to be either)."""
    return " ".join(str(value).split())[:n]


def _why(status: int, body: Any, text: str) -> str:
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        return f"{status} {_line(err.get('code', ''), 60)}: {_line(err.get('message', ''), 300)}".strip()
    return f"{status}: {text[:200]!r}"


def _answer(http, method: str, url: str, what: str, deadline: float, **kw: Any) -> tuple[int, Any, str]:
    """(status, parsed JSON or None, the text) of ``what``'s answer, through ``nvrm.remote.exchange`` (the client's and
    the judges' bounded exchange): read up to ``MAX_ANSWER_BYTES`` and by ``deadline`` (``time.monotonic``),
    ``RefreshError`` in one line past either. Not retried: a failed swap is retried by running the cycle again."""
    from ..remote.exchange import TooSlow, exchange

    try:
        got = exchange(http, method, url, limit=MAX_ANSWER_BYTES, deadline=deadline, **kw)
    except TooSlow:
        raise RefreshError(f"{what} did not finish its answer in time (--serve's timeout); the server is not answering as nvrm serve does") from None
    if got.unread:
        raise RefreshError(f"{what} answered {got.declared} bytes (at most {MAX_ANSWER_BYTES} are read): not an nvrm serve answer")
    if got.body.too_large:
        raise RefreshError(f"{what} answered more than {MAX_ANSWER_BYTES} bytes (at most that is read): not an nvrm serve answer")
    if got.body.error:
        raise RefreshError(f"{what}: {got.body.error}: not an nvrm serve answer")
    text = got.body.text()
    try:
        body = json.loads(text)
    except (ValueError, RecursionError):
        body = None
    return got.status, body, text


def _object(status: int, body: Any, text: str, what: str) -> dict[str, Any]:
    """``body`` when it is a JSON object; ``RefreshError`` naming ``what`` otherwise (HTML, a list, nothing)."""
    if not isinstance(body, dict):
        kind = "a JSON " + type(body).__name__ if body is not None else "not JSON"
        raise RefreshError(f"{what} answered {status} with {kind} ({text[:80]!r}), not an nvrm serve JSON object")
    return body


def _serving(listing: dict[str, Any], name: str) -> dict[str, Any] | None:
    models = listing.get("models")
    rows = [m for m in models if isinstance(m, dict)] if isinstance(models, list) else []
    return next((m for m in rows if m.get("name") == name and m.get("state") == "serving"), None)


def manifest_digest(bundle: str | Path) -> str | None:
    """The sha256 of the bundle's integrity manifest: the revision ``nvrm serve`` names a bundle by (its answers'
    ``revision``, ``nvrm.serve.models.registry.manifest_sha256``); None without one."""
    import hashlib

    from ..bundle import MANIFEST_NAMES

    for name in MANIFEST_NAMES:
        f = Path(bundle) / name
        if f.is_file():
            return hashlib.sha256(f.read_bytes()).hexdigest()
    return None


def swap_into(url: str, bundle: str | Path, *, model: str | None = None, admin_key_env: str = "NVRM_ADMIN_KEY",
              api_key_env: str | None = None, timeout_s: float = 600.0) -> dict[str, Any]:
    """Swap ``bundle`` into the ``nvrm serve`` at ``url`` as ``model`` (default: the server's default model).

    Returns ``{"url", "model", "path", "previous_revision", "revision"}`` once verified: the swap's answer names the
    revision asked for (the sha256 of the bundle's manifest) and a ``GET /v1/models`` after it lists that revision
    serving. A refusal, an answer that is not an nvrm serve JSON object (HTML, a list, over ``MAX_ANSWER_BYTES``),
    or a swap that does not verify raises ``RefreshError`` in one line; nothing is then recorded as swapped."""
    import time
    from urllib.parse import quote

    import httpx

    admin = os.environ.get(admin_key_env)
    if not admin:
        raise ConfigError(f"--admin-key-env {admin_key_env}: the environment variable is not set; it must hold the server's admin key")
    headers = {ADMIN_HEADER: admin}
    if api_key_env:
        key = os.environ.get(api_key_env)
        if not key:
            raise ConfigError(f"--serve-key-env {api_key_env}: the environment variable is not set")
        headers["Authorization"] = f"Bearer {key}"
    base = _base(url)
    path = str(Path(bundle).resolve())
    wanted = manifest_digest(path)
    if wanted is None:
        raise RefreshError(f"--serve {url}: {path} has no RELEASE_MANIFEST.json; nvrm serve swaps in only verified bundles")
    deadline = time.monotonic() + timeout_s
    retry = "the bundle stays exported, run nvrm refresh again to retry the swap"
    try:
        with httpx.Client(timeout=httpx.Timeout(timeout_s, connect=10.0), headers=headers) as http:
            what = f"--serve {url}: GET /v1/models"
            status, body, text = _answer(http, "GET", f"{base}/v1/models", what, deadline)
            if status != 200:
                raise RefreshError(f"{what} answered {_why(status, body, text)}")
            served = _object(status, body, text, what)
            name = model or served.get("default")
            before = _serving(served, name) if isinstance(name, str) and name else None
            if before is None:
                listed = sorted({str(m.get("name"))[:40] for m in served.get("models") or [] if isinstance(m, dict)}) \
                    if isinstance(served.get("models"), list) else []
                raise RefreshError(f"--serve {url}: serves no model {str(name)[:80]!r} (it serves {listed})")
            what = f"--serve {url}: PUT /v1/models/{name}"
            status, body, text = _answer(http, "PUT", f"{base}/v1/models/{quote(name, safe='')}", what, deadline, json={"path": path})
            if status != 200:
                raise RefreshError(f"--serve {url}: the swap of model {name!r} was refused: {_why(status, body, text)}; {retry}")
            answer = _object(status, body, text, what)
            if answer.get("revision") != wanted:
                raise RefreshError(f"{what} answered 200 naming revision {str(answer.get('revision'))[:80]!r}, but {path} is revision "
                                   f"{wanted}: the swap is not verified and not recorded; {retry}")
            what = f"--serve {url}: GET /v1/models after the swap"
            status, body, text = _answer(http, "GET", f"{base}/v1/models", what, deadline)
            now = _serving(_object(status, body, text, what), name) if status == 200 else None
            if now is None or now.get("revision") != wanted:
                shown = f"lists model {name!r} at revision {str(now.get('revision'))[:80]!r}" if now else f"answered {_why(status, body, text)}"
                raise RefreshError(f"{what} {shown}, not {wanted}: the swap is not verified and not recorded; {retry}")
    except (httpx.HTTPError, httpx.StreamError, httpx.InvalidURL) as e:
        raise RefreshError(f"--serve {url}: the server cannot be reached ({type(e).__name__}: {e}); the bundle stays exported") from e
    previous = answer.get("previous_revision")
    return {"url": url, "model": name, "path": path, "previous_revision": previous if isinstance(previous, str) else before.get("revision"),
            "revision": wanted, "bundle_revision": bundle_revision(path)}


def bundle_revision(bundle: str | Path) -> str | None:
    """The revision a bundle's manifest records (``source.revision``): what its results' ``model_revision`` says in process,
    and what ``--record`` rows stamp; the server's answers name the manifest's sha256 instead."""
    try:
        return json.loads((Path(bundle) / "RELEASE_MANIFEST.json").read_text()).get("source", {}).get("revision")
    except (OSError, ValueError, AttributeError):
        return None


def swap_once(cycle_root: Path, bundle: str, url: str, **kw: Any) -> tuple[dict[str, Any], bool]:
    """``swap_into`` unless ``cycle_root/export/swap.json`` says this bundle went to this server and model already;
    returns (what swap.json holds, whether it swapped now)."""
    note = cycle_root / "export" / "swap.json"
    try:
        done = json.loads(note.read_text())
    except (OSError, ValueError):
        done = None
    path = str(Path(bundle).resolve())
    if isinstance(done, dict) and done.get("url") == url and done.get("path") == path and kw.get("model") in (None, done.get("model")):
        return done, False
    out = swap_into(url, bundle, **kw)
    tmp = note.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(out) + "\n")
    tmp.replace(note)
    return out, True
