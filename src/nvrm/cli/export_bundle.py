"""``nvrm export --vllm``: a bundle in the sequence-classification layout vLLM loads."""

from __future__ import annotations

import argparse

from ..errors import ConfigError


def add_args(p: argparse.ArgumentParser) -> None:
    """Flags of ``nvrm export``: the source bundle, the output folder, the format (``--vllm``) and ``--overwrite``."""
    p.add_argument("bundle", help="source bundle directory (release layout; verified against its manifest first)")
    p.add_argument("out", help="output directory (must not exist, or be empty)")
    p.add_argument("--vllm", action="store_true", help="write Qwen3VLForSequenceClassification for vLLM's pooling runner")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty output directory")


def run(args: argparse.Namespace) -> int:
    """Export the bundle and print what was written; ``nvrm verify OUT`` checks it against the source later."""
    if not args.vllm:
        raise ConfigError("nvrm export: choose a format; the one there is today is --vllm")
    from ..bundle.vllm_export import export_vllm

    report = export_vllm(args.bundle, args.out, overwrite=args.overwrite)
    rev = f" (revision {report.source_revision})" if report.source_revision else ""
    source = f"source manifest sha256 {report.source_manifest_sha256}" if report.source_manifest_sha256 else "the source had no manifest"
    copied = len(report.copied)
    print(f"{report.path}: {report.tensors} tensors as Qwen3VLForSequenceClassification, {copied} file(s) copied; {source}{rev}")
    print(f"load it with vLLM: LLM({str(report.path)!r}, runner='pooling', convert='classify'); check it with: nvrm verify {report.path}")
    return 0
