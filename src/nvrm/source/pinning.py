"""Which served model and revision score an RL run (issue 39), and which revision scored each step.

    trl_reward("http://127.0.0.1:8000", model="mine", revision="<manifest sha256>")

- ``model=``: the served model's name (``GET /v1/models``); URL mode only.
- ``revision=``: in URL mode, sent as ``expect_revision``: a server at another revision answers 409, and the
  adapter raises one ``RevisionMismatch`` line instead of scoring a step on a revision nobody asked for.
  In process it stays what it always was: the Hub revision the bundle is downloaded at.
- ``revisions_of(results)``: per item, the revision that scored it (None for failed items); the adapters
  log it (TRL's ``log_extra`` / ``log_metric``, verl's ``reward_extra_info``), and a step scored by more
  than one revision (a swap landed in the middle of it) is logged as a warning, never silently mixed.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

from ..errors import ConfigError, NvrmError, RevisionMismatch

log = logging.getLogger(__name__)


def client_kwargs(load: dict[str, Any]) -> dict[str, Any]:
    """The ``RewardClient`` settings of an adapter's keyword arguments: ``revision`` becomes ``expect_revision``."""
    out = dict(load)
    if "revision" in out:
        revision = out.pop("revision")
        if revision is not None and (not isinstance(revision, str) or not revision):
            raise ConfigError(f"revision={revision!r}: give the served model's revision (its manifest sha256, GET /v1/models)")
        out.setdefault("expect_revision", revision)
    return out


def in_process_kwargs(load: dict[str, Any], where: str) -> dict[str, Any]:
    """The load settings of a bundle scored in process; ``model=`` (a served model's name) is refused there."""
    if load.get("model") is not None:
        raise ConfigError(f"model={load['model']!r}: names a model of nvrm serve, but {where} is scored in process; "
                          "give the server's URL, or leave model= out")
    return {k: v for k, v in load.items() if k != "model"}


def pinned(error: NvrmError) -> NvrmError:
    """``error`` as the adapter reports it; a server at another revision than ``revision=`` is raised (one line)."""
    if getattr(error, "code", None) == "revision_mismatch":
        raise RevisionMismatch(f"revision= pinned, but the server refused: {error}", 409, "revision_mismatch") from error
    return error


def revisions_of(results: Sequence[Any]) -> list[str | None]:
    """Per item, the model revision that scored it (None for a failed item)."""
    return [getattr(r, "model_revision", None) if not isinstance(r, BaseException) else None for r in results]


def distinct(revisions: Sequence[str | None], where: str) -> list[str]:
    """The revisions that scored a step, in order; more than one is logged as a warning (a swap mid-step)."""
    seen = list(dict.fromkeys(r for r in revisions if r is not None))
    if len(seen) > 1:
        log.warning("%s: one step was scored by %d model revisions (%s); pin revision= to refuse that", where, len(seen), ", ".join(seen))
    return seen
