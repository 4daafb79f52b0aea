"""The ``render`` hook: what the policy wrote becomes the candidate video.

Text trainers (TRL, verl) train a policy that writes text: a prompt, an action sequence, a camera
path. The reward must follow what it wrote, so a ``render`` hook turns each completion into the
candidate video, typically by calling a world model:

    def render(prompt, completion, **row) -> video        # one item; row = the dataset columns
    @nvrm.rl.batched
    def render(prompts, completions, rows) -> [video]     # the whole call at once

A video is anything ``score`` takes (a path, bytes, ``nvrm.Clip``, a list of frames). A hook
may be given as a callable or, from a YAML config (verl), as ``"package.module:function"``.
A hook that raises fails only its own item (batched: every item of the call), with its message.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Sequence

from ..errors import ConfigError, InputError


def batched(fn: Callable) -> Callable:
    """Mark a render hook as batched: ``fn(prompts, completions, rows) -> list of videos``."""
    fn.batched = True  # type: ignore[attr-defined]
    return fn


def resolve(render: Any, where: str = "render") -> Callable | None:
    """A callable, an import string ``"module:attr"``, or None."""
    if render is None or callable(render):
        return render
    if isinstance(render, str) and ":" in render:
        module, _, attr = render.partition(":")
        try:
            obj = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise ConfigError(f"{where}={render!r}: cannot import it ({type(e).__name__}: {e})") from e
        if not callable(obj):
            raise ConfigError(f"{where}={render!r}: {type(obj).__name__} is not callable")
        return obj
    raise ConfigError(f"{where}={render!r}: must be a callable or an import string 'package.module:function'")


def row_of(row: dict) -> dict:
    """A row's fields as the hook's keyword arguments (``prompt`` and ``completion`` are positional)."""
    return {k: v for k, v in row.items() if k not in ("prompt", "completion") and isinstance(k, str)}


def render_all(render: Callable, prompts: Sequence[Any], completions: Sequence[Any], rows: Sequence[dict]) -> list[Any]:
    """One candidate (or ``InputError``) per completion."""
    n = len(completions)
    if getattr(render, "batched", False):
        try:
            out = list(render(list(prompts), list(completions), list(rows)))
        except Exception as e:  # noqa: BLE001 - the hook's failure fails its items, with its message
            err = InputError("render", f"the batched render hook failed: {type(e).__name__}: {e}")
            return [err] * n
        if len(out) != n:
            err = InputError("render", f"the batched render hook returned {len(out)} videos for {n} completions")
            return [err] * n
        return [InputError("render", "the render hook returned None") if v is None else v for v in out]
    out = []
    for i, (p, c, row) in enumerate(zip(prompts, completions, rows)):
        try:
            v = render(p, c, **row)
            out.append(InputError(f"render[{i}]", "the render hook returned None") if v is None else v)
        except Exception as e:  # noqa: BLE001
            out.append(InputError(f"render[{i}]", f"{type(e).__name__}: {e}"))
    return out
