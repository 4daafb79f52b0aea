"""A load-time check of what nvrm does not own: the bundle's tokenizer and image processor, as this transformers runs them.

nvrm owns the arithmetic that defines the reward (``nvrm.forward``), but two inputs of it come from transformers
(and tokenizers): the token ids (the chat template's rendering and the tokenizer) and, where nvrm's pixel codec
does not apply, the processor's pixel values. ``pyproject.toml`` accepts every transformers from 4.57.6 on, releases
nvrm was never run on included, so at load one fixed chat text (a prompt with non-ASCII text, digits, an emoji and
odd whitespace, in the release contract's layout with one context and one candidate image) and one small fixed frame
go through the bundle's processor, and the sha256 of the token ids and of the pixel values must equal what the
release profile (transformers 4.57.6) gave, recorded in ``selfcheck.json`` under the bundle's processor files'
digest (``preprocessing_fingerprint`` with the release contract). A difference is a ``ConfigError`` of one line
that names the transformers version; a bundle whose processor files were never recorded (a tokenizer of your own)
is not checked (logged once at debug level).

Cost: a few milliseconds once per bundle per process (later loads of the same files reuse the answer); measured in
docs/contract.md ("Supported transformers"). ``NVRM_SKIP_SELFCHECK=1`` skips it. The engine's workers copy the
processor this check ran on (threads) or unpickle it under the same transformers (processes), so they need none of
their own. Record the table again, on purpose and only under 4.57.6, with
``NVRM_UPDATE_SELFCHECK=1 .venv/bin/python -m pytest tests/unit/test_selfcheck.py``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..contract import RELEASE_CONTRACT
from ..errors import ConfigError

log = logging.getLogger("nvrm")

RELEASE_PROFILE = "4.57.6"
"""The transformers whose behaviour the table records."""
TABLE = Path(__file__).with_name("selfcheck.json")
"""``{"transformers": "4.57.6", "bundles": {digest: {"name", "ids", "pixels"}}}``."""
PROMPT = "A person walks down a street at night — naïve café, 東京 3.5 km/h 🙂\n  two  spaces\tand a tab"
"""The fixture's prompt: text a tokenizer's normaliser and pre-tokeniser treat differently if anything does."""
_PASSED: set[str] = set()
"""Digests checked in this process under this transformers (a second load of the same files costs nothing)."""


def frame() -> np.ndarray:
    """The fixture's frame: uint8 (64, 64, 3), a fixed pattern (no random generator, whose stream could change). Small
    enough that torch's elementwise work on it stays on one thread (a 64x96 frame took 30 ms on a loaded 2-core
    machine, this one 0.3 ms)."""
    y, x, c = np.meshgrid(np.arange(64), np.arange(64), np.arange(3), indexing="ij")
    return ((y * 7 + x * 13 + c * 89 + (x * y) % 17) % 256).astype(np.uint8)


def _digest(array: np.ndarray) -> str:
    a = np.ascontiguousarray(array)
    return hashlib.sha256(f"{a.dtype.str}|{a.shape}|".encode() + a.tobytes()).hexdigest()


def measure(processor) -> dict[str, str]:
    """The sha256 of the fixture's token ids and of its frame's pixel values (and grid) through ``processor``."""
    from PIL import Image

    from ..forward.compat import pixel_bounds
    from .chat import render
    from .encode import tokenize

    text = render(processor, PROMPT, 1, 1, RELEASE_CONTRACT)
    ids = tokenize(processor, text).numpy().astype("<i8")
    out = processor.image_processor(images=[Image.fromarray(frame())], return_tensors="pt",
                                    **pixel_bounds(RELEASE_CONTRACT.min_pixels, RELEASE_CONTRACT.max_pixels))
    pixels = out["pixel_values"].numpy().astype("<f4")
    grid = out["image_grid_thw"].numpy().astype("<i8")
    return {"ids": _digest(ids), "pixels": hashlib.sha256((_digest(pixels) + _digest(grid)).encode()).hexdigest()}


def bundle_key(path: Path) -> str:
    """The table's key of a bundle: the digest of its processor, tokenizer and template files (under the release contract)."""
    from ..bundle import preprocessing_fingerprint

    return preprocessing_fingerprint(Path(path), RELEASE_CONTRACT)


def recorded() -> dict[str, dict[str, str]]:
    """The table: bundle key -> {"name", "ids", "pixels"} as transformers 4.57.6 gave them."""
    return json.loads(TABLE.read_text(encoding="utf-8"))["bundles"]


def check(processor, key: str) -> None:
    """Raise a one-line ``ConfigError`` when ``processor`` (a bundle's, whose files have ``key``) gives other token ids
    or pixel values than the release profile recorded; a no-op for a bundle the table does not hold."""
    import transformers

    want = recorded().get(key)
    if want is None:
        log.debug("transformers self-check: no recorded behaviour for processor files %s…; not checked", key[:12])
        return
    got = measure(processor)
    changed = [name for name, what in (("ids", "token ids"), ("pixels", "pixel values")) if got[name] != want[name]]
    if changed:
        what = " and ".join({"ids": "token ids", "pixels": "pixel values"}[c] for c in changed)
        raise ConfigError(
            f"transformers {transformers.__version__} changes the {what} of the bundle's processor on nvrm's fixed self-check "
            f"({', '.join(f'{c} sha256 {got[c][:12]}… where {RELEASE_PROFILE} gave {want[c][:12]}…' for c in changed)}), so its rewards would "
            f"not be the release's; install a transformers nvrm was tested on (README, \"Supported transformers\") and report this version, "
            "or set NVRM_SKIP_SELFCHECK=1 to load anyway"
        )


def load_checked_processor(path: str | os.PathLike) -> Any:
    """The bundle's processor (``nvrm.bundle.load_processor``), checked against the table once per bundle per process."""
    from ..bundle import load_processor

    processor = load_processor(Path(path))
    if os.environ.get("NVRM_SKIP_SELFCHECK", "") not in ("", "0"):
        return processor
    key = bundle_key(Path(path))
    if key not in _PASSED:
        check(processor, key)
        _PASSED.add(key)
    return processor
