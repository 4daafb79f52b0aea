"""The training pipeline as two library calls: ``fit`` (pairs -> an exported, checked bundle) and
``prepare_store`` (pairs files -> a prepared-input store, here or on Ray). ``nvrm train`` and
``nvrm prefs prepare`` are thin shells over them; the benchmarks and notebooks call them too.

    summary = fit("base-bundle", "train_pairs.jsonl", "runs/a", TrainConfig(epochs=1), eval_pairs="eval_pairs.jsonl")
    summary.bundle                      # runs/a/bundle, loaded back and compared with the trained model
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..errors import InputError, TrainingError
from .config import TrainConfig


@dataclass(frozen=True)
class Summary:
    """What one ``fit`` did (also written to ``OUTPUT/summary.json`` by rank 0)."""

    world_size: int
    """processes that trained (1 alone; N under torchrun / accelerate launch)"""
    steps: int
    """optimizer steps taken (counting the steps of a resumed run)"""
    train_seconds: float
    """wall seconds of the training phase"""
    weights_in_sync: bool
    """every rank ended with the same weights (digest compared across ranks)"""
    stopped_early: bool = False
    """the run stopped at a checkpoint (``max_steps``/signal): nothing exported; ``resume=True`` continues"""
    bundle: str | None = None
    """the exported bundle's folder (rank 0; None when stopped early or on other ranks)"""
    revision: str | None = None
    """the exported bundle's revision"""
    eval: Mapping[str, Any] | None = None
    """held-out metrics of the exported bundle, loaded back as a user would (with ``eval_pairs``)"""
    export_max_abs_diff: float | None = None
    """largest |reward difference| between the exported bundle and the trained model on ``eval_pairs``"""
    rank: int = 0
    """the process this summary is from (0 writes and reports; not part of the JSON form)"""

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``summary.json``, ``nvrm train --json``): unset fields left out."""
        out: dict[str, Any] = {"world_size": self.world_size, "steps": self.steps, "train_seconds": self.train_seconds,
                               "weights_in_sync": self.weights_in_sync}
        if self.stopped_early:
            out["stopped_early"] = True
        for key in ("bundle", "revision", "eval", "export_max_abs_diff"):
            value = getattr(self, key)
            if value is not None:
                out[key] = dict(value) if key == "eval" else value
        return out


def _check_output(out: Path, resume: bool) -> None:
    if out.exists() and not out.is_dir():
        raise InputError(str(out), "is a file; --output must be a folder")
    if out.exists() and any(out.iterdir()) and not resume:
        raise InputError(str(out), "is not empty; pass --resume (resume=True) to continue a run or choose a new folder")
    out.mkdir(parents=True, exist_ok=True)


def fit(base: str | Path, pairs: str | Path, output: str | Path, config: TrainConfig = TrainConfig(), *,
        eval_pairs: str | Path | None = None, store: str | Path | None = None, resume: bool = False,
        device: str | None = None) -> Summary:
    """Fine-tune ``base`` on the preference ``pairs`` and export ``OUTPUT/bundle``, alone or data-parallel
    (every rank of ``torchrun`` / ``accelerate launch`` calls it; rank 0 writes).

    With ``store`` the videos come from a prepared-input store (built first where missing); with
    ``eval_pairs`` the model is evaluated every epoch and the exported bundle is loaded back and must
    score like the trained model. A run that collapsed to one reward is refused (``TrainingError``)."""
    from .dist import Ranks
    from .trainer import Trainer

    ranks = Ranks.start(device)
    out = Path(output)
    problem = None
    if ranks.is_main:  # one rank decides about the folder; every rank learns the answer
        try:
            _check_output(out, resume)
        except InputError as e:
            problem = e
    ranks.check_all(problem)
    trainer = Trainer(base, out, config, ranks=ranks, store=store)
    if store:
        built = trainer.build_store([pairs] + ([eval_pairs] if eval_pairs else []))
        trainer.say(f"nvrm train: store {store}: {built['stored']} videos prepared now, {built['skipped']} already there, "
                    f"{built['failed']} failed")
    train_rows = trainer.load_pairs(pairs, "training")
    eval_rows = trainer.load_pairs(eval_pairs, "eval") if eval_pairs else None
    if resume:
        trainer.resume()
    run = trainer.train(train_rows, eval_rows)
    final_eval = trainer.evaluate(eval_rows) if eval_rows else None
    digests = ranks.gather(trainer.weights_digest(), to_all=True)
    fields: dict[str, Any] = {"world_size": ranks.world, "steps": run["steps"], "train_seconds": run["seconds"],
                              "weights_in_sync": len(set(digests)) == 1, "stopped_early": bool(run["stopped_early"]),
                              "rank": ranks.rank}
    if not run["stopped_early"]:
        refuse_collapsed(final_eval or trainer.evaluate(train_rows[:16]), "held-out" if final_eval else "training")
        bundle, merged = trainer.export(out / "bundle", pairs, eval_pairs, {"train": run, "eval_before_export": final_eval})
        if ranks.is_main:
            fields.update(_check_export(bundle, merged, eval_pairs))
    summary = Summary(**fields)
    if ranks.is_main:
        (out / "summary.json").write_text(json.dumps(summary.to_dict(), indent=1) + "\n")
    ranks.barrier()
    return summary


def refuse_collapsed(ev: dict, what: str) -> None:
    """No export of a model that gives every candidate one reward (a run that diverged to a constant)."""
    rewards = (ev.get("rewards") or {}).get("all") or {}
    if ev.get("n", 0) >= 2 and rewards.get("std") == 0:
        raise TrainingError(
            f"the trained model gives every {what} candidate the same reward ({rewards.get('mean')}): it collapsed; no bundle is exported "
            "and the checkpoints are kept (lower --lr and train again)"
        )


def _check_export(bundle: Path, merged, eval_pairs: str | Path | None) -> dict[str, Any]:
    """The exported bundle, loaded as any user would, must score like the model that was trained."""
    from ..report.evaluate import evaluate_pairs, summarize
    from ..scoring.reward_model import RewardModel

    out: dict[str, Any] = {"bundle": str(bundle), "revision": merged.revision}
    if eval_pairs:
        from ..prefs.pairs import read_pairs

        loaded = RewardModel.from_pretrained(bundle, device=str(merged.device))
        rows = read_pairs(eval_pairs)
        got, _ = evaluate_pairs(loaded, rows)
        want, _ = evaluate_pairs(merged, rows)
        out["eval"] = summarize(got)
        out["export_max_abs_diff"] = max((abs(a.chosen - b.chosen) + abs(a.rejected - b.rejected) for a, b in zip(got, want)), default=0.0)
        loaded.close()
    return out


@dataclass(frozen=True)
class RayStore:
    """Where and how ``prepare_store`` runs on Ray: Ray Data tasks, each writing its own shards."""

    address: str | None = None
    """auto, ray://host:10001, or None for a local cluster"""
    cpus_per_task: float = 1.0
    """CPUs reserved per preparation task"""
    videos_per_task: int = 32
    """videos one task prepares (one shard each)"""


@dataclass(frozen=True)
class StoreBuild:
    """What one ``prepare_store`` did."""

    store: str
    videos: int
    """distinct (video, role) the pairs files name"""
    stored: int
    """prepared now"""
    skipped: int
    """already in the store (a rebuild resumes)"""
    seconds: float
    failures: tuple[tuple[str, str, str], ...] = field(default_factory=tuple)
    """(path, role, one-line reason) of every video that could not be prepared"""

    @property
    def failed(self) -> int:
        """How many videos could not be prepared."""
        return len(self.failures)


def prepare_store(model: Any, pairs_files: Sequence[str | Path], store: str | Path, *, settings: Any = None,
                  ray: RayStore | None = None) -> StoreBuild:
    """Run every video the ``pairs_files`` name once through the contract into ``store`` (for ``fit(store=...)``).

    ``model`` is a bundle (a path or hub name; with ``settings``, a ``LoadSettings``) or, here only, a loaded
    ``RewardModel``. With ``ray`` the work runs as Ray Data tasks on a cluster. One video that fails is
    listed in ``failures``; the rest are stored."""
    from ..prefs.pairs import Pair, read_pairs
    from .data import pair_videos
    from .store import StoreWriter, build_store, pending

    videos = sorted({k for f in pairs_files for r in read_pairs(f) if isinstance(r, Pair) for k in pair_videos(r)})
    t0 = time.perf_counter()
    failures: list[tuple[str, str, str]] = []
    if ray is not None:
        from ..bundle import preprocessing_fingerprint, resolve_bundle
        from ..contract import Contract
        from .ray_store import build_store_on_ray

        bundle = resolve_bundle(model)
        fingerprint = preprocessing_fingerprint(bundle, Contract.for_bundle(bundle))
        StoreWriter(store, fingerprint).close()  # store.json first (or the refusal of another store)
        todo, skipped = pending(videos, store)
        out = build_store_on_ray(str(bundle), todo, str(store), fingerprint, address=ray.address,
                                 cpus_per_task=ray.cpus_per_task, videos_per_task=ray.videos_per_task)
        stored, failures = out["stored"], [tuple(f) for f in out["failed"]]
    elif hasattr(model, "score"):
        counts = build_store(model, videos, store, on_error=lambda p, r, e: failures.append((p, r, str(e))))
        stored, skipped = counts["stored"], counts["skipped"]
    else:
        from ..scoring.reward_model import RewardModel

        with RewardModel.from_pretrained(model, settings=settings) as loaded:
            counts = build_store(loaded, videos, store, on_error=lambda p, r, e: failures.append((p, r, str(e))))
        stored, skipped = counts["stored"], counts["skipped"]
    return StoreBuild(str(store), len(videos), stored, skipped, time.perf_counter() - t0, tuple(failures))
