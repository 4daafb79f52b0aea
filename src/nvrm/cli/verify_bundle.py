"""``nvrm verify``: a bundle against its manifest."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..bundle import verify_bundle
from ..errors import BundleError


def add_verify_args(p: argparse.ArgumentParser) -> None:
    """Flags of ``nvrm verify``: the bundle directory and ``--no-cache``."""
    p.add_argument("bundle", help="bundle directory")
    p.add_argument("--no-cache", action="store_true", help="re-hash every file instead of using the digest cache")
    p.add_argument("--source", help="for an `nvrm export` folder: its source bundle (default: the path the export recorded)")


def run_verify(args: argparse.Namespace) -> int:
    """Check every file of a bundle against its integrity manifest and print the result.

    Also checks the config's sizes against sane limits and the shards' declared shapes. Returns 1 when the
    bundle has no manifest; a mismatch raises a ``BundleError`` (exit code 2)."""
    bundle = Path(args.bundle)
    if not bundle.is_dir():
        raise BundleError(f"{bundle}: no such bundle directory")
    from ..bundle.vllm_export import is_export, verify_export

    if is_export(bundle):  # an export: its own files, then tensor by tensor against the source bundle
        check = verify_export(bundle, args.source)
        rev = f", revision {check.revision}" if check.revision else ""
        print(f"{bundle}: OK, {check.files} file(s) match NVRM_EXPORT.json; {check.tensors} tensors equal {check.source}'s{rev}")
        return 0
    report = verify_bundle(bundle, use_cache=not args.no_cache)
    from ..bundle.load import check_weight_shapes, raw_config

    raw_config(bundle)  # a Qwen3-VL config with sizes within sane limits,
    check_weight_shapes(bundle)  # and the ones the weights have: before anything is built
    if report.manifest is None:
        print(f"{bundle}: no manifest; nothing verified", file=sys.stderr)
        return 1
    from ..bundle import template_source

    rev = f", revision {report.revision}" if report.revision else ""
    print(f"{bundle}: OK, {report.files_checked} file(s) match {report.manifest}{rev} ({report.cache_hits} from digest cache)")
    print(f"{bundle}: chat template from {template_source(bundle) or 'nowhere (the bundle has none)'}")
    return 0
