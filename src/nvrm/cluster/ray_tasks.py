"""What every nvrm Ray Data task needs: Ray itself (or the one line saying how to install it), one inline
preprocessing engine per bundle in each task process, and a failure turned into one line of data."""

from __future__ import annotations

from typing import Any

from ..errors import InputError, InternalError, NvrmError

_ENGINES: dict[str, Any] = {}


def require_ray():
    """The ``ray`` module; an ``InputError`` naming ``--ray`` and the install command when it is missing."""
    try:
        import ray
    except ImportError as e:  # pragma: no cover - ray is installed with the test extra
        raise InputError("--ray", "Ray is not installed; pip install 'nvrm[ray]'") from e
    return ray


def task_engine(bundle: str):
    """This task process's engine for ``bundle``, made once (inline, no worker processes: Ray's tasks are the parallelism)."""
    if bundle not in _ENGINES:
        from ..engine import Engine

        _ENGINES[bundle] = Engine.for_bundle(bundle, workers=0)
    return _ENGINES[bundle]


def error_text(e: BaseException) -> str:
    """The one line a task sends back for a failure: an ``NvrmError``'s own message, anything else as an internal error."""
    return str(e) if isinstance(e, NvrmError) else str(InternalError.wrap(e))
