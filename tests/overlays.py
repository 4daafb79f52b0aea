"""Other packages on this environment's own torch: an overlay folder put first on ``PYTHONPATH``.

Used for the transformers version matrix (``tests/versions``) and cosmos-rl's client code
(``tests/trainers``).

A venv of its own would install torch again (5.5 GB from the local wheel cache for each version);
an overlay holds only the packages that differ from this environment for that transformers
(transformers, huggingface_hub, tokenizers and their new dependencies, about 120-160 MB), resolved
by pip against this environment, so the exact same torch build runs under every version.
Overlays and the trainers' venvs are cached outside the clone, under ``NVRM_TEST_ENVS`` (``make``
sets ``~/.cache/nvrm/test-envs``; without it, ``.venv/matrix/``), each in a folder keyed by what it
installs and the interpreter and torch it installs against: a second ``make test``, or a fresh clone
on the same machine, builds nothing, and a changed pin builds a new folder instead of reusing a
stale one. A build holds a lock on its folder, so two runs never build one environment at once.

Environments are installed with uv (``install``; a test dependency, from the registry): it downloads in parallel
and compiles no bytecode, so vLLM's 3 GB venv builds in about 20 s where pip took 12.5 minutes on these 2 cores,
and verl's (6 GB with torch 2.14.1's CUDA libraries) in under a minute. Overlays stay with pip (small; resolved
against this environment with ``--dry-run --report``), and so does the client where installing it is what a test checks.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]
UV = Path(sys.executable).parent / "uv"
LOCAL_WHEELS = [p for p in (Path("/opt/wheels"), Path("/opt/pypi/files"), Path("/opt/pypi-more/files")) if p.is_dir()]
"""This machine's local wheel folders (its torch builds lie there): searched besides the registry."""


def install(python: Path, requirements: list[str], *, offline: bool = False, timeout: float = 1800) -> None:
    """Install ``requirements`` with uv into the environment of ``python``, finding packages in this machine's local
    wheel folders besides the registry (``offline``: there only)."""
    cmd = [str(UV), "pip", "install", "--quiet", "--python", str(python)]
    for folder in LOCAL_WHEELS:
        cmd += ["--find-links", str(folder)]
    if offline:
        cmd.append("--no-index")
    _run([*cmd, *requirements], timeout=timeout)


def matrix_dir() -> Path:
    """Where cached test environments live (outside the clone when ``NVRM_TEST_ENVS`` is set, as ``make`` does)."""
    return Path(os.environ.get("NVRM_TEST_ENVS") or os.environ.get("NVRM_MATRIX_DIR") or ROOT / ".venv" / "matrix")


def env_key(name: str, spec: object) -> str:
    """A folder name for an environment: ``name`` plus a digest of what it installs, this interpreter, its torch and the
    release profile's pins (an overlay is resolved against this environment, so it is only valid beside the same pins)."""
    import torch

    pins = (ROOT / "constraints" / "release.txt").read_text()
    blob = json.dumps([spec, sys.version, torch.__version__, pins])
    return f"{name}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


@contextlib.contextmanager
def building(target: Path) -> Iterator[None]:
    """Hold an exclusive lock for building ``target`` (another run waits, then finds it built)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def overlay(requirements: list[str], name: str, *, no_deps: bool = False) -> Path:
    """A folder with the packages ``requirements`` need beyond this environment (built once, then reused).

    ``no_deps``: exactly the packages named (for a package whose declared dependencies would bring
    another torch or a GPU stack, as cosmos-rl's do, when only its pure-Python parts run)."""
    target = matrix_dir() / env_key(name, [requirements, no_deps])
    with building(target):
        return _build_overlay(target, requirements, no_deps)


def _build_overlay(target: Path, requirements: list[str], no_deps: bool) -> Path:
    done = target / ".complete"
    if done.is_file() and json.loads(done.read_text()) == requirements:
        return target
    target.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    if no_deps:
        pins = list(requirements)
    else:
        report = target.parent / f"{target.name}.report.json"
        _run([*pip, "install", "--dry-run", "--report", str(report), *requirements])
        pins = [f"{p['metadata']['name']}=={p['metadata']['version']}" for p in json.loads(report.read_text())["install"]]
    if any(p.lower().startswith(("torch==", "torchvision==")) for p in pins):
        raise RuntimeError(f"{requirements} would install another torch: {pins}")
    # pip, not uv: an overlay is small, and pip honours PIP_IGNORE_REQUIRES_PYTHON (unirl's client declares 3.12)
    _run([*pip, "install", "--no-compile", "--no-deps", "--upgrade", "--target", str(target), *pins])
    done.write_text(json.dumps(requirements))
    return target


def env_with(target: Path, **extra: str) -> dict[str, str]:
    """This process's environment with ``target`` first on ``PYTHONPATH`` (and ``src/`` after it)."""
    path = [str(target), str(ROOT / "src")]
    if os.environ.get("PYTHONPATH"):
        path.append(os.environ["PYTHONPATH"])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path), **extra}


def _run(cmd: list[str], timeout: float = 1800) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
