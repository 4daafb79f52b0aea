"""The flags of every command that loads a model, and the model they describe."""

from __future__ import annotations

import argparse



def add_model_args(p: argparse.ArgumentParser, required: bool = True, *, named: bool = False) -> None:
    """``--model`` plus one flag per ``LoadSettings`` and ``Limits`` field (cli/options.py); ``named``: repeatable NAME=DIR."""
    from ..limits import Limits
    from ..settings import LoadSettings
    from .options import add_dataclass_args

    if named:  # nvrm serve: several models by name (nvrm.serve.models)
        p.add_argument("--model", required=required, action="append", help="bundle directory, or NAME=DIR (repeatable; the first is the default)")
    else:
        p.add_argument("--model", required=required, help="bundle directory (or Hub repo id)")
    add_dataclass_args(p, LoadSettings, group="model settings")
    add_dataclass_args(p, Limits, group="limits (checked before the work they protect)")


def settings_from_args(args: argparse.Namespace):
    """The ``LoadSettings`` (with its ``Limits``) the model flags describe."""
    from ..limits import Limits
    from ..settings import LoadSettings
    from .options import dataclass_from_args

    return dataclass_from_args(args, LoadSettings, limits=dataclass_from_args(args, Limits))


def load_model(args: argparse.Namespace):
    """The ``RewardModel`` of ``--model`` with the settings the flags describe."""
    from ..scoring.reward_model import RewardModel

    return RewardModel.from_pretrained(args.model, settings=settings_from_args(args))
