"""``RewardModel.from_pretrained(DIR, backend="vllm")``: nvrm's contract in front, vLLM's pooling runner behind.

nvrm does everything the contract says (sampling, the resize, the JPEG q85 round trip, the chat layout with the
generation prompt, the pixel bounds) with its own engine; vLLM (``nvrm.forward.vllm_backend``) receives those
frames and that text and returns the head's logit. A group goes to vLLM as one group, so prefix caching shares
its context. Results are ``VllmScoreResult``: ``backend == "vllm"``, never exact (``exact=True`` is refused),
and there are no gradients (``differentiable()`` is refused: the differentiable reward runs on nvrm's engine).

``DIR`` is an ``nvrm export --vllm`` folder, or a bundle, exported on the fly into
``$NVRM_CACHE_DIR/vllm-exports/<source manifest sha256>`` (default ``~/.cache/nvrm``).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import shutil
from dataclasses import fields
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from ..bundle.vllm_export import export_vllm, is_export, read_export_manifest, verify_export
from ..contract import Contract
from ..engine import Engine
from ..engine.chat import build_messages, check_prompt, images_kwargs, render
from ..errors import BackendError, InternalError, NvrmError
from ..forward.vllm_backend import HttpVllm, InProcessVllm, VllmRequest, check_head_dim, import_vllm, vllm_is_cpu
from ..results import ScoreResult, VllmScoreResult
from ..settings import LoadSettings
from .items import Errors, GroupLike, ItemLike, as_group, as_item
from .loading import head_dtype_for
from .streaming import ResultMaker

_SALTS = itertools.count()
VLLM_HANDOVER_TOKENS = 1 << 20
"""Key positions the service's scheduler hands vLLM at once when ``max_batch_tokens`` is unset (vLLM pages the rest)."""
NOT_EXACT = "exact=True: the vLLM backend is never exact (its kernels are not nvrm's); score exactly with backend='nvrm'"


def cache_root() -> Path:
    """Where on-the-fly exports go: ``vllm-exports`` in nvrm's cache (``$NVRM_CACHE_DIR``, default ``~/.cache/nvrm``)."""
    from ..bundle import cache_dir

    return cache_dir() / "vllm-exports"


def resolve_export(path: str | os.PathLike, verify: bool) -> Path:
    """An export folder for ``path``: itself when it is one (checked when ``verify``), else its export in the cache."""
    from ..bundle import read_integrity_manifest, resolve_bundle, sha256_file

    path = Path(path)
    if is_export(path):
        if verify:
            source = Path(str(read_export_manifest(path)["source"].get("path") or ""))
            if source.is_dir():
                verify_export(path, source)
        return path
    bundle = resolve_bundle(path, None)
    manifest = read_integrity_manifest(bundle)
    if manifest is None:
        raise BackendError(f"{bundle}: backend='vllm' exports the bundle first and needs its manifest; run nvrm export --vllm yourself")
    out = cache_root() / sha256_file(bundle / manifest.name)[:32]
    if not is_export(out):
        tmp = out.with_name(out.name + f".tmp{os.getpid()}")
        export_vllm(bundle, tmp, overwrite=True)
        if not out.exists():
            tmp.replace(out)
        else:  # another process finished the same export first
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def export_model_config(export: Path):
    """The export's ``Qwen3VLConfig`` (``read_config`` accepts only the release's architectures; an export names the classifier)."""
    import json

    from transformers import Qwen3VLConfig

    from ..bundle.vllm_export import EXPORT_ARCHITECTURE

    raw = json.loads((export / "config.json").read_text(encoding="utf-8"))
    if raw.get("model_type") != "qwen3_vl" or raw.get("architectures") != [EXPORT_ARCHITECTURE]:
        raise BackendError(f"{export}/config.json: not an nvrm export "
                           f"(needs model_type 'qwen3_vl' and architectures [{EXPORT_ARCHITECTURE!r}])")
    return Qwen3VLConfig.from_pretrained(str(export))


def export_engine(export: Path, config, settings: LoadSettings) -> Engine:
    """nvrm's preprocessing engine over the export's processor, contract and positions (the same files as its source)."""
    from ..engine import RopeSpec
    from ..engine.selfcheck import load_checked_processor

    return Engine(load_checked_processor(export), Contract.for_bundle(export), RopeSpec.from_config(config), workers=settings.workers,
                  kind=settings.worker_kind, limits=settings.limits)  # type: ignore[arg-type]


class VllmRewardModel:
    """The scoring API of ``RewardModel`` (score, score_batch, score_group, score_groups) over vLLM."""

    backend = "vllm"

    def __init__(self, export: Path, engine: Engine, forward, settings: LoadSettings, revision: str | None):
        from ..bundle import preprocessing_fingerprint

        self.path, self.engine, self.forward, self.settings, self.revision = export, engine, forward, settings, revision
        self.contract: Contract = engine.contract
        self.processor = engine.processor
        self.fingerprint = preprocessing_fingerprint(export, self.contract)
        self.results = ResultMaker(self.fingerprint, revision, self.contract)

    @classmethod
    def load(cls, path_or_repo, settings: LoadSettings, contract: Contract | None = None, *, options: dict | None = None,
             url: str | None = None, forward=None) -> "VllmRewardModel":
        """Prepare the export and nvrm's engine, check what vLLM cannot run, start vLLM in this process or reach the
        server at ``url`` (a ``forward`` object replaces both in tests)."""
        if settings.exact:
            raise BackendError(NOT_EXACT)
        if contract is not None:
            raise BackendError("contract=: the vLLM backend scores the export's own contract (nvrm_contract.json)")
        on_cpu = vllm_is_cpu(import_vllm()) if forward is None and url is None else False  # a missing vLLM is refused before any work
        export = resolve_export(path_or_repo, settings.verify)
        config = export_model_config(export)
        if forward is None and url is None:
            check_head_dim(config, on_cpu)
        engine = export_engine(export, config, settings)
        try:
            c = engine.contract
            if forward is None and url is not None:
                forward = HttpVllm(url, export, bounds=images_kwargs(c), chat_kwargs={"enable_thinking": c.enable_thinking},
                                   timeout_s=settings.vllm_timeout_s)
            elif forward is None:
                forward = InProcessVllm(export, dtype=settings.dtype, head_dtype=head_dtype_for(c, settings.dtype),
                                        bounds=images_kwargs(c), max_images=(c.max_context_frames or 48) + c.candidate_frames,
                                        options=options)
        except BaseException:
            engine.close()
            raise
        return cls(export, engine, forward, settings, read_export_manifest(export)["source"].get("revision"))

    # ------------------------------------------------------------ what vLLM cannot do

    def differentiable(self, **_: Any):
        """Refused: the differentiable reward stays on nvrm's engine (``backend='nvrm'``)."""
        raise BackendError("differentiable(): the vLLM backend has no gradients; "
                           "the differentiable reward runs on nvrm's engine (backend='nvrm')")

    @staticmethod
    def _not_exact(exact: bool | None) -> None:
        if exact:
            raise BackendError(NOT_EXACT)

    # ------------------------------------------------------------ scoring

    def _result(self, context, candidate, score) -> "VllmScoreResult | NvrmError":
        r = self.results(context, candidate, score.num_tokens, score.reward)
        return r if isinstance(r, NvrmError) else VllmScoreResult(**{f.name: getattr(r, f.name) for f in fields(ScoreResult)},
                                                                  cached_tokens=score.cached_tokens)

    def _request(self, prompt: str, ctx, cand) -> VllmRequest:
        """What vLLM scores for one prepared (context, candidate): the rendered chat text and the contract's frames."""
        n_ctx, n_cand = len(ctx.images), len(cand.images)
        return VllmRequest(render(self.processor, prompt, n_ctx, n_cand, self.contract), (*ctx.images, *cand.images),
                           tuple(build_messages(prompt, n_ctx, n_cand, self.contract)))

    def _classified(self, pairs: Sequence[tuple[str, Any, Any]], errors: Errors, salt: str | None = None) -> list[Any]:
        """Results for prepared (prompt, context, candidate) triples, in order: vLLM's failure fills every slot (or raises).
        With ``salt`` each request gets a cache salt of its own, so none shares another's prefix-cache blocks."""
        requests = [self._request(*p) for p in pairs]
        if salt is not None:
            requests = [dataclasses.replace(r, salt=f"{salt}-{k}") for k, r in enumerate(requests)]
        try:
            scores: list[Any] = self.forward.classify(requests) if requests else []
        except NvrmError as e:
            if errors == "raise":
                raise
            scores = [e] * len(pairs)
        except Exception as e:  # noqa: BLE001 - a bug must not stop the service's scorer or pass as a result
            if errors == "raise":
                raise
            scores = [InternalError.wrap(e)] * len(pairs)
        return [s if isinstance(s, NvrmError) else self._result(ctx, cand, s) for (_, ctx, cand), s in zip(pairs, scores)]

    def _group(self, prompt, context, candidates: Sequence[Any], errors: Errors, share_prefix: bool = True) -> list[Any]:
        """One group: context prepared once, candidates each (bad ones fail their slots), the good ones to vLLM together."""
        check_prompt(self.processor, prompt, self.limits)
        self.limits.check_group(len(candidates))
        ctx = self.engine.prepare(context, "context")
        futures = [self.engine.submit_video(c, "candidate") for c in candidates]
        out: list[Any] = [None] * len(candidates)
        good = []
        for j, f in enumerate(futures):
            try:
                good.append((j, f.result()))
            except NvrmError as e:
                if errors == "raise":
                    raise
                out[j] = e
        salt = None if share_prefix else f"nvrm-unshared-{next(_SALTS)}"
        for (j, _), r in zip(good, self._classified([(prompt, ctx, c) for _, c in good], errors, salt)):
            out[j] = r
        if errors == "raise":
            first = next((r for r in out if isinstance(r, NvrmError)), None)
            if first is not None:
                raise first
        return out

    # ------------------------------------------------------------ what nvrm serve's scheduler calls (nvrm.serve.execution)

    @property
    def max_batch_tokens(self) -> int:
        """The scheduler's budget per hand-over: vLLM batches and pages by itself, so only nvrm's setting bounds it."""
        return self.settings.max_batch_tokens or VLLM_HANDOVER_TOKENS

    @property
    def concurrent_forwards(self) -> int:
        """Forwards the service's scheduler may have in flight at once: a vLLM server's (``HttpVllm.concurrency``), which needs
        no process-wide forward lock; 1 for vLLM in this process (one at a time under the lock, like nvrm's engine)."""
        return int(getattr(self.forward, "concurrency", 1) or 1)

    @property
    def device(self):
        """Where the service's latent decoder runs: the GPU vLLM uses, else the CPU."""
        import torch

        return torch.device("cuda" if torch.cuda.is_available() else "cpu")

    def score_prepared_each(self, prepared: Sequence[Any], *, exact: bool | None = None) -> list[Any]:
        """One result or error per item the engine prepared, in order, handed to vLLM in one call."""
        if exact:
            return [BackendError(NOT_EXACT)] * len(prepared)
        return self._classified([(p.prompt, p.context, p.candidate) for p in prepared], "return")

    def score_prepared_group(self, group, *, exact: bool | None = None) -> list[Any]:
        """One result per candidate slot of a group the engine prepared; a failed context or prompt fills every slot."""
        if exact:
            return [BackendError(NOT_EXACT)] * len(group.candidates)
        if isinstance(group.context, NvrmError) or group.error is not None:
            return [group.context if isinstance(group.context, NvrmError) else group.error] * len(group.candidates)
        out: list[Any] = list(group.candidates)
        good = [j for j, c in enumerate(group.candidates) if not isinstance(c, NvrmError)]
        for j, r in zip(good, self._classified([(group.prompt, group.context, group.candidates[j]) for j in good], "return")):
            out[j] = r
        return out

    def score_prepared_group_reusing(self, group, prefix) -> tuple[list[Any], None]:
        """``score_prepared_group``; vLLM keeps the context's prefix itself (its prefix cache), so none is handed back."""
        return self.score_prepared_group(group), None

    @property
    def limits(self):
        """The input limits (from the load settings)."""
        return self.settings.limits

    def score(self, prompt: str, context, candidate) -> VllmScoreResult:
        """Reward for one (prompt, context, candidate), by vLLM."""
        return self._group(prompt, context, [candidate], "raise")[0]

    def score_group(self, prompt: str, context, candidates: Sequence[Any], *, errors: Errors = "raise",
                    exact: bool | None = None, share_prefix: bool = True) -> list[Any]:
        """Rewards for G candidates sharing one prompt and context, sent to vLLM as one group (a bad context raises).
        ``share_prefix=False`` gives every candidate its own cache salt: vLLM's prefix caching off for this call."""
        self._not_exact(exact)
        return self._group(prompt, context, candidates, errors, share_prefix)

    def score_groups(self, groups: Iterable[GroupLike], *, errors: Errors = "return", exact: bool | None = None,
                     lookahead: int | None = None) -> Iterator[list[Any]]:
        """One list of results per group, in order; with ``errors="return"`` a bad group fills its slots with its error."""
        self._not_exact(exact)
        for k, group in enumerate(groups):
            try:
                prompt, context, candidates = as_group(group, k)
                yield self._group(prompt, context, candidates, errors)
            except NvrmError as e:
                if errors == "raise":
                    raise
                n = len(group[2]) if isinstance(group, (tuple, list)) and len(group) == 3 and isinstance(group[2], Sequence) else 1
                yield [e] * max(1, n)

    def score_batch(self, items: Iterable[ItemLike], *, errors: Errors = "raise", exact: bool | None = None) -> list[Any]:
        """Rewards for independent items, one result (or, with ``errors="return"``, error) per item, in order."""
        self._not_exact(exact)
        out: list[Any] = []
        for i, raw in enumerate(items):
            try:
                it = as_item(raw, i)
                out.append(self._group(it.prompt, it.context, [it.candidate], "raise")[0])
            except NvrmError as e:
                if errors == "raise":
                    raise
                out.append(e)
            except Exception as e:  # noqa: BLE001 - a bug must not pass as a result
                if errors == "raise":
                    raise
                out.append(InternalError.wrap(e))
        return out

    def info(self) -> dict[str, Any]:
        """What is loaded and how it runs."""
        return {"path": str(self.path), "revision": self.revision, "backend": "vllm", "dtype": self.settings.dtype,
                "contract": self.contract.fingerprint, "preprocessing": self.fingerprint, "exact": False}

    def close(self) -> None:
        """Stop nvrm's preprocessing workers and let vLLM go."""
        self.engine.close()
        close = getattr(self.forward, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> "VllmRewardModel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
