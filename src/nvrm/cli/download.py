"""``nvrm download``: a bundle from the Hugging Face Hub, at a pinned revision."""

from __future__ import annotations

import argparse

from ..bundle import DEFAULT_REPO, download_bundle, verify_bundle


def add_download_args(p: argparse.ArgumentParser) -> None:
    """Flags of ``nvrm download``: repository id, revision and destination."""
    p.add_argument("--repo", default=DEFAULT_REPO, help=f"Hub repo id (default {DEFAULT_REPO})")
    p.add_argument("--revision", help="commit sha to pin (recommended)")
    p.add_argument("--local-dir", help="directory to download into (default: the Hub cache)")


def run_download(args: argparse.Namespace) -> int:
    """Download a release bundle from the model hub (safetensors only) and verify it. Returns 0 on success."""
    path = download_bundle(args.repo, revision=args.revision, local_dir=args.local_dir)
    report = verify_bundle(path)
    print(f"downloaded {args.repo}@{args.revision or 'main'} to {path} ({report.files_checked} file(s) verified)")
    return 0
