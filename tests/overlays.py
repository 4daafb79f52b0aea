"""Other packages on this environment's own torch: an overlay folder put first on ``PYTHONPATH``.

Used for the transformers version matrix (``tests/versions``) and cosmos-rl's client code
(``tests/trainers``).

A venv of its own would install torch again (5.5 GB from the local wheel cache for each version);
an overlay holds only the packages that differ from this environment for that transformers
(transformers, huggingface_hub, tokenizers and their new dependencies, about 120-160 MB), resolved
by pip against this environment, so the exact same torch build runs under every version.
Overlays are kept under ``.venv/matrix/`` (``NVRM_MATRIX_DIR`` elsewhere), so a second
``make test`` downloads nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def matrix_dir() -> Path:
    return Path(os.environ.get("NVRM_MATRIX_DIR", ROOT / ".venv" / "matrix"))


def overlay(requirements: list[str], name: str, *, no_deps: bool = False) -> Path:
    """A folder with the packages ``requirements`` need beyond this environment (built once, then reused).

    ``no_deps``: exactly the packages named (for a package whose declared dependencies would bring
    another torch or a GPU stack, as cosmos-rl's do, when only its pure-Python parts run)."""
    target = matrix_dir() / name
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
    _run([*pip, "install", "--no-deps", "--upgrade", "--target", str(target), *pins])
    done.write_text(json.dumps(requirements))
    return target


def env_with(target: Path, **extra: str) -> dict[str, str]:
    """This process's environment with ``target`` first on ``PYTHONPATH`` (and ``src/`` after it)."""
    path = [str(target), str(ROOT / "src")]
    if os.environ.get("PYTHONPATH"):
        path.append(os.environ["PYTHONPATH"])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path), **extra}


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
