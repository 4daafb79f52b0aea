"""Command-line flags generated from the settings dataclasses, so each setting is declared once.

``add_dataclass_args(parser, LoadSettings)`` adds one flag per field: the name
with dashes (or the field's ``flag`` metadata), the field's help text and
default, its type from the annotation; booleans that default to True get a
``--no-...`` flag. ``dataclass_from_args`` builds the object back, so a
flag can never drift from the field it sets.

``DeferredParser`` is the parser of every subcommand: its flags are added when it is used, so a
subcommand's flags never cost another subcommand (or ``nvrm --help``) an import.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Any, Callable

from ..errors import ConfigError


class DeferredParser(argparse.ArgumentParser):
    """A subcommand's parser that adds its flags (``add_args``) the first time it parses or prints its help.

    Some flags are generated from settings dataclasses whose modules import more than the command line needs:
    deferred, ``nvrm --help`` and every other subcommand never import them. Every
    subcommand's ``add_args`` is given one, and a sub-parser it adds (``add_subparsers``) is one too."""

    def __init__(self, *args, add_args: Callable[[argparse.ArgumentParser], None] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._pending = add_args

    def complete(self, deep: bool = False) -> None:
        """Add the flags now, once (``deep``: and those of every deferred parser below, as ``build_parser()`` does)."""
        add, self._pending = self._pending, None
        if add is not None:
            add(self)
        for action in self._actions if deep else ():
            for child in (action.choices or {}).values() if isinstance(action, argparse._SubParsersAction) else ():
                if isinstance(child, DeferredParser):
                    child.complete(deep=True)

    def parse_known_args(self, args=None, namespace=None):
        """``argparse.ArgumentParser.parse_known_args``, once the flags are added."""
        self.complete()
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        """``argparse.ArgumentParser.format_help``, once the flags are added."""
        self.complete()
        return super().format_help()

    def format_usage(self) -> str:
        """``argparse.ArgumentParser.format_usage``, once the flags are added."""
        self.complete()
        return super().format_usage()


def flag_of(f: dataclasses.Field) -> str:
    """The command-line flag of a dataclass field: its ``flag`` metadata, or ``--`` plus the name with dashes."""
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def _kind(f: dataclasses.Field, hints: dict[str, Any]) -> Any:
    t = hints[f.name]
    args = [a for a in typing.get_args(t) if a is not type(None)]
    return args[0] if args and typing.get_origin(t) in (typing.Union, getattr(__import__("types"), "UnionType", None)) else t


def add_dataclass_args(parser: argparse._ActionsContainer, cls: type, *, exclude: tuple[str, ...] = (), group: str | None = None) -> None:
    """One flag per field of ``cls`` (fields with ``cli=False`` metadata and ``exclude`` are skipped)."""
    target = parser.add_argument_group(group) if group else parser
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in exclude or f.metadata.get("cli", True) is False:
            continue
        flag = flag_of(f)
        default = f.default if f.default is not dataclasses.MISSING else None
        help_text = f.metadata.get("help", "")
        kind = _kind(f, hints)
        dest = f"{cls.__name__}.{f.name}"
        if f.name == "compile":  # --compile [MODE]
            target.add_argument(flag, dest=dest, nargs="?", const=True, default=default, metavar="MODE", help=help_text)
        elif f.metadata.get("repeat"):
            target.add_argument(flag, dest=dest, action="append", default=[], metavar="VALUE", help=help_text)
        elif kind is bool and default is None:  # unset, on, or off: --flag / --no-flag
            target.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        elif kind is bool:
            if default is True:
                target.add_argument(flag, dest=dest, action="store_false", help=help_text + " (on by default; this flag turns it off)")
            else:
                target.add_argument(flag, dest=dest, action="store_true", help=help_text)
        else:
            caster = kind if kind in (int, float, str) else str
            choices = f.metadata.get("choices")
            shown = "" if default is None else f" (default {default})"
            required = bool(f.metadata.get("required"))
            shown = "" if required else shown
            target.add_argument(
                flag, dest=dest, type=caster, default=None if required else default, required=required,
                choices=choices, metavar=None if choices else f.name.upper(), help=help_text + shown,
            )


def dataclass_from_args(args: argparse.Namespace, cls: type, **extra: Any) -> Any:
    """Build ``cls`` from the flags ``add_dataclass_args`` added (plus ``extra`` fields)."""
    values = dict(extra)
    prefix = cls.__name__ + "."
    for key, value in vars(args).items():
        if key.startswith(prefix):
            values[key[len(prefix):]] = tuple(value) if isinstance(value, list) else value
    try:
        return cls(**values)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError(f"invalid {cls.__name__}: {e}") from e


def add_ray_args(p: argparse.ArgumentParser, *, what: str, replica: str) -> argparse._ArgumentGroup:
    """The Ray flags ``nvrm batch`` and ``nvrm serve`` share; returns the group for command-specific ones."""
    ray = p.add_argument_group(f"Ray ({what})")
    ray.add_argument("--ray", action="store_true", help=f"run on Ray: {replica}")
    ray.add_argument("--ray-address", default=None, metavar="ADDR", help="auto, ray://host:10001, or unset for a local cluster")
    ray.add_argument("--replicas", type=int, default=1, help="model replicas (one model each)")
    ray.add_argument("--gpus-per-replica", type=float, default=0.0, help="GPUs per replica (0 on CPU-only clusters)")
    return ray


def check_outputs(inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
    """Refuse (before anything is read or written) an output that is one of the command's inputs, or
    two outputs that are one file: writing would destroy the input or one of the results.

    ``inputs`` and ``outputs`` map a flag (``"--input"``) to a path, or to a list of paths; None is skipped."""
    import os
    from pathlib import Path

    from ..errors import InputError

    def paths(named: dict[str, Any]):
        for flag, value in named.items():
            for p in value if isinstance(value, (list, tuple)) else [value]:
                if p is not None:
                    yield flag, Path(p)

    def same(a: Path, b: Path) -> bool:
        if a.resolve() == b.resolve():
            return True
        try:
            return a.exists() and b.exists() and os.path.samefile(a, b)
        except OSError:
            return False

    seen: list[tuple[str, Path]] = list(paths(inputs))
    for flag, out in paths(outputs):
        for other_flag, other in seen:
            if same(out, other):
                kind = "input" if other_flag in inputs else "output"
                raise InputError(f"{flag} {out}", f"is the same file as the {kind} {other_flag} {other}; writing it would destroy it. Choose another file")
        seen.append((flag, out))
