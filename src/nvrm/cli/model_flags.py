"""The flags of every command that loads a model, and the model they describe."""

from __future__ import annotations

import argparse



def add_model_args(p: argparse.ArgumentParser, required: bool = True, *, named: bool = False, backends: bool = False,
                   monitored: bool = False) -> None:
    """``--model`` plus one flag per ``LoadSettings`` and ``Limits`` field (cli/options.py); ``named``: repeatable NAME=DIR;
    ``backends``: ``--backend`` and ``--vllm-url`` (commands that score through ``RewardModel``'s scoring API);
    ``monitored``: ``--member-rate``, for a command that keeps a monitor (nvrm serve), the only reader of sampled members."""
    from ..limits import Limits
    from ..settings import LoadSettings
    from .options import add_dataclass_args

    if named:  # nvrm serve: several models by name (nvrm.serve.models.registry)
        p.add_argument("--model", required=required, action="append", help="bundle directory, or NAME=DIR (repeatable; the first is the default)")
    else:
        p.add_argument("--model", required=required, help="bundle directory (or Hub repo id)")
    exclude = (() if backends else ("vllm_timeout_s",)) + (() if monitored else ("member_rate",))
    add_dataclass_args(p, LoadSettings, group="model settings", exclude=exclude)
    if backends:
        g = p.add_argument_group("backend")
        g.add_argument("--backend", choices=("nvrm", "vllm"), default="nvrm",
                       help="nvrm's exact engine (default), or vLLM's pooling runner behind nvrm's contract (never exact; needs nvrm[vllm])")
        g.add_argument("--vllm-url", default=None,
                       help="with --backend vllm: a vLLM server someone else runs (its /classify route), instead of vLLM in this process")
    add_dataclass_args(p, Limits, group="limits (checked before the work they protect)")


def settings_from_args(args: argparse.Namespace):
    """The ``LoadSettings`` (with its ``Limits``) the model flags describe."""
    from ..limits import Limits
    from ..settings import LoadSettings
    from .options import dataclass_from_args

    return dataclass_from_args(args, LoadSettings, limits=dataclass_from_args(args, Limits))


def backend_kwargs(args: argparse.Namespace) -> dict:
    """``backend=`` and ``vllm_url=`` for ``RewardModel.from_pretrained`` (nvrm's engine when the command has no such flags)."""
    from ..errors import ConfigError

    backend, url = getattr(args, "backend", "nvrm"), getattr(args, "vllm_url", None)
    if url and backend != "vllm":
        raise ConfigError(f"--vllm-url {url}: needs --backend vllm")
    return {"backend": backend, "vllm_url": url}


def load_model(args: argparse.Namespace):
    """The ``RewardModel`` of ``--model`` with the settings the flags describe (on ``--backend`` where the command has it)."""
    from ..scoring.reward_model import RewardModel

    return RewardModel.from_pretrained(args.model, settings=settings_from_args(args), **backend_kwargs(args))
