"""``nvrm`` command line: a thin table of subcommands over library functions.

Expected failures (bad input, bad bundle, no network) print one line,
``nvrm: error: ...``, and exit 2. Tests call ``main(argv)`` directly.

The command answers at once: each subcommand module imports only argparse-level code, its run function
imports the library it needs, and ``main`` adds a subcommand's flags only when that subcommand is used
(``build_parser(deferred=True)``), so ``nvrm --help``, ``nvrm verify`` and ``nvrm download`` import no torch.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.util
import logging
import sys
import warnings
from types import ModuleType
from typing import Callable, Sequence

from ..errors import NvrmError
from .options import DeferredParser
from . import batch, bench, demo, download, evaluation, export_bundle, prefs, probe, rank, score, serve, show_frames, train, verify_bundle
from . import guard, refresh

# (name, help, add_arguments, run)
SUBCOMMANDS: list[tuple[str, str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = [
    ("score", "score one candidate continuation", score.add_score_args, score.run_score),
    ("frames", "write the exact frames the model sees", show_frames.add_frames_args, show_frames.run_frames),
    ("verify", "check a bundle against its manifest", verify_bundle.add_verify_args, verify_bundle.run_verify),
    ("export", "write a bundle in another engine's layout (--vllm: Qwen3VLForSequenceClassification)", export_bundle.add_args, export_bundle.run),
    ("download", "download a bundle from the Hugging Face Hub", download.add_download_args, download.run_download),
    ("batch", "score a manifest of clips into a resumable JSONL/CSV/Parquet file", batch.add_batch_args, batch.run_batch),
    ("rank", "rank candidates for one context (optionally as an HTML report)", rank.add_rank_args, rank.run_rank),
    ("eval", "pairwise accuracy on preference pairs, with a plot", evaluation.add_eval_args, evaluation.run_eval),
    ("probe", "score candidates under a battery of perturbations and flag potential reward hacks", probe.add_args, probe.run),
    ("guard", "fit or show a bundle's guard: an uncertainty on every reward, and the conservative reward for RL", guard.add_args, None),
    ("serve", "run the reward service (HTTP, dynamic batching)", serve.add_args, serve.run),
    ("train", "fine-tune a reward model on preference pairs (LoRA, Bradley-Terry) and export a bundle", train.add_train_args, train.run_train),
    ("prefs", "preference data: pairs from rollouts, judgments, filtering, the synthetic task, a prepared store", prefs.add_prefs_args, None),
    ("demo", "score sample clips (demo weights unless --model is given)", demo.add_args, demo.run),
    ("bench", "benchmark naive vs batch vs group scoring", bench.add_args, bench.run),
    ("refresh", "one refresh cycle: judge the record's rollouts, train a LoRA, gate it, export it (resumable)", refresh.add_args, refresh.run),
]


def build_parser(deferred: bool = False) -> argparse.ArgumentParser:
    """The ``nvrm`` argument parser with every subcommand registered.

    ``deferred``: each subcommand's flags are added when it is used (what ``main`` does), not all at once."""
    parser = argparse.ArgumentParser(prog="nvrm", description="WORL-NVRM next-video reward model runtime")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=DeferredParser)
    for name, help_text, add_args, run in SUBCOMMANDS:
        p = sub.add_parser(name, help=help_text, description=help_text, add_args=add_args)
        if not deferred:
            p.complete(deep=True)
        if run is not None:
            p.set_defaults(run=run)
    return parser


class _AfterImport(importlib.abc.MetaPathFinder):
    """A one-shot meta-path finder: runs ``then(module)`` right after the module ``name`` is first imported."""

    def __init__(self, name: str, then: Callable[[ModuleType], None]):
        self.name, self.then = name, then

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)  # the finders after this one find it
        if spec is not None and hasattr(spec.loader, "exec_module"):
            run, then = spec.loader.exec_module, self.then

            def exec_module(module: ModuleType) -> None:
                run(module)
                then(module)

            spec.loader.exec_module = exec_module  # type: ignore[union-attr]
        return spec


def _when_imported(name: str, then: Callable[[ModuleType], None]) -> None:
    """``then(module)`` once the module ``name`` is imported: now if it is, else right after its first import, so the
    CLI can quiet a library without importing it."""
    if name in sys.modules:
        then(sys.modules[name])
    elif not any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, then))


def _quiet_transformers(hf_logging: ModuleType) -> None:
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def _quiet_libraries(verbose: bool) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="nvrm: %(message)s")
    # transformers (and the torch beneath it) costs seconds to import: quieted when a command imports it, not before
    _when_imported("transformers.utils.logging", _quiet_transformers)

    def show(message, category, filename, lineno, file=None, line=None):  # one line, no source path
        print(f"nvrm: warning: {' '.join(str(message).split())}", file=sys.stderr)

    warnings.showwarning = show
    # libraries' deprecation chatter is not the user's to fix: silenced per library, not globally
    for module in ("transformers", "torch", "torchvision", "accelerate", "huggingface_hub", "av", "peft", "ray", "qwen_vl_utils"):
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=module)
        warnings.filterwarnings("ignore", category=FutureWarning, module=module)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``nvrm`` command: parse ``argv`` (default ``sys.argv[1:]``), run the subcommand and return its exit code.

    An :class:`NvrmError` prints one line to stderr and returns its ``exit_code``; Ctrl-C returns 130."""
    parser = build_parser(deferred=True)
    args = parser.parse_args(argv)
    _quiet_libraries(args.verbose)
    try:
        return int(args.run(args) or 0)
    except NvrmError as e:
        print(f"nvrm: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("nvrm: interrupted", file=sys.stderr)
        return 130
    except MemoryError:
        print("nvrm: error: out of memory (an allocation failed); lower the limits or batch sizes you raised, or give the process more memory", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 - a bug or an environment problem: one line, the traceback with -v
        if args.verbose:
            raise
        detail = " ".join(str(e).split())[:300]
        if "allocate" in detail.lower() or "out of memory" in detail.lower():
            print(f"nvrm: error: out of memory ({detail[:160]}); lower the limits or batch sizes you raised, or give the process more memory", file=sys.stderr)
            return 1
        print(f"nvrm: error: internal error: {type(e).__name__}: {detail} (rerun with -v for the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
