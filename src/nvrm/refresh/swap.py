"""``nvrm refresh --serve URL``: after a passed gate and its export, swap the exported bundle into a running
``nvrm serve`` through its admin route (``PUT /v1/models/{name}`` with the admin key, ``nvrm.serve.model_swap``).

Every reward the server gives from then on carries the new revision, and so does every row its
``--record`` writes (each row stamps the revision that scored it). The cycle keeps what it did in
``CYCLE/export/swap.json`` (server, model, previous and new revision); a cycle run again does not swap twice.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..errors import ConfigError, RefreshError

ADMIN_HEADER = "X-Nvrm-Admin-Key"
"""The header ``nvrm serve`` reads the admin key from (``nvrm.serve.model_swap.ADMIN_HEADER``)."""


def _base(url: str) -> str:
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _why(r) -> str:
    try:
        err = r.json().get("error") or {}
        return f"{r.status_code} {err.get('code', '')}: {err.get('message', r.text[:200])}".strip()
    except ValueError:
        return f"{r.status_code}: {r.text[:200]}"


def swap_into(url: str, bundle: str | Path, *, model: str | None = None, admin_key_env: str = "NVRM_ADMIN_KEY",
              api_key_env: str | None = None, timeout_s: float = 600.0) -> dict[str, Any]:
    """Swap ``bundle`` into the ``nvrm serve`` at ``url`` as ``model`` (default: the server's default model).

    Returns ``{"url", "model", "path", "previous_revision", "revision"}``; a refusal raises ``RefreshError`` with the server's reason."""
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
    try:
        with httpx.Client(timeout=httpx.Timeout(timeout_s, connect=10.0), headers=headers) as http:
            listed = http.get(f"{base}/v1/models")
            if listed.status_code != 200:
                raise RefreshError(f"--serve {url}: GET /v1/models answered {_why(listed)}")
            served = listed.json()
            name = model or served.get("default")
            before = [m for m in served.get("models", []) if m.get("name") == name and m.get("state") == "serving"]
            if not before:
                raise RefreshError(f"--serve {url}: serves no model {name!r} (it serves {sorted({m.get('name') for m in served.get('models', [])})})")
            path = str(Path(bundle).resolve())
            r = http.put(f"{base}/v1/models/{name}", json={"path": path})
    except httpx.HTTPError as e:
        raise RefreshError(f"--serve {url}: the server cannot be reached ({type(e).__name__}: {e}); the bundle stays exported") from e
    if r.status_code != 200:
        raise RefreshError(f"--serve {url}: the swap of model {name!r} was refused: {_why(r)}; the bundle stays exported, "
                           "run nvrm refresh again to retry the swap")
    answer = r.json()
    return {"url": url, "model": name, "path": path, "previous_revision": answer.get("previous_revision", before[0].get("revision")),
            "revision": answer.get("revision"), "bundle_revision": bundle_revision(path)}


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
