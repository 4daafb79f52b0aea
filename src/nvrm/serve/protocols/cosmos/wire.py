"""cosmos-rl's remote-reward protocol: its enqueue bodies in, its pull answers out (no I/O, no scoring).

cosmos-rl (0.3.9, 0.4.x) sends each rollout to ``POST /api/reward/enqueue`` as

    json.dumps({"prompts": [...B], "reward_fn": {"nvrm": 1.0}, "video_infos": [{"video_fps": 16.0}] * B,
                "media_type": "latent"}).encode() + b"\\n" + np.save(array)

where the array is the Wan2.1-VAE latents ``[B, 16, T_lat, H/8, W/8]`` (float32 from the legacy
``RemoteReward``, float16 with ``media_type: latent`` from ``RemoteRewardCalculator``), or, with
``media_type: video``, uint8 pixels ``[B, T, H, W, 3]`` (or ``[B, 3, T, H, W]``). It answers
``{"uuid": ...}`` and later pulls ``POST /api/reward/pull`` (form ``uuid``, ``type``) for
``{"scores": {key: [B floats]}, "input_info", "duration", "decoded_duration", "type"}``.

Everything about a body is checked here before any decoding: JSON and ``.npy`` header, dtype,
shape against the byte count and the limits, never a pickle. A rollout's leading
``context_frames`` pixel frames are its context (the conditioning frames are inside the video);
the rest is the candidate, whose last 5 s the contract samples at 1 FPS.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ....errors import RequestError
from ....protocol import ErrorCode
from .latents import CHANNELS, SPATIAL_OF, decoded_bytes, frames_of
from ...admission.media import npy_header
from ...http.request_bodies import parse_json

REWARD_NAMES = ("nvrm",)
"""The ``reward_fn`` names a server of one unnamed model computes; with ``--model NAME=DIR`` they are the served names."""
SCORE_KEYS = ("reward", "overall_reward")
"""Keys every pull answer holds (the same raw reward: ``overall_reward`` is cosmos-rl's default ``score_key``)."""
SIGMA_DATA_RANGE = (0.01, 100.0)
"""The ``sigma_data`` taken: the latents are divided by it, so a tiny one blows them up past what the VAE decodes
(to NaN: a black video) and a huge one flattens every rollout to the mean latent."""
_FLOAT = {"<f4": np.float32, "<f2": np.float16, "=f4": np.float32, "=f2": np.float16}
_UINT8 = ("|u1", "<u1", "u1", "=u1")
IMAGE_AS = ("refuse", "still")
"""What a ``media_type: image`` rollout becomes (``--cosmos-image-as``): refused, or held as a still video."""
STILL_FLAG = ("image rollouts scored as still videos (--cosmos-image-as still): each image held for the context frames and "
              "the candidate's length; not the 5 s continuation the contract scores")


@dataclass(frozen=True)
class MediaRules:
    """What this server does with each ``media_type``: from its settings, its contract and its latent decoder."""

    image_as: str = "refuse"
    """``refuse`` or ``still`` (``IMAGE_AS``)."""
    context_frames: int = 1
    """Leading frames that are the context (``--context-frames``); a still image is held for them too."""
    candidate_seconds: float = 5.0
    """The candidate's length under the contract: a still image is held this long after its context frames."""
    latent_channels: int | None = None
    """The latent decoder's channels (16: Wan2.1, 48: Wan2.2 / Cosmos), or None without one."""
    names: tuple[str, ...] = REWARD_NAMES
    """The ``reward_fn`` names scored here: the served models' names, the default first."""


def media_rules(config, contract, decoder, names: tuple[str, ...] | list[str] = REWARD_NAMES) -> MediaRules:
    """The ``MediaRules`` of a server with ``config`` (a ``ServeConfig``), ``contract``, ``decoder`` (a ``LatentDecoder`` or None)
    and the served models' ``names``."""
    return MediaRules(getattr(config, "cosmos_image_as", "refuse"), config.context_frames, float(contract.candidate_seconds),
                      getattr(decoder, "channels", CHANNELS) if decoder is not None else None, tuple(names) or REWARD_NAMES)


@dataclass(frozen=True)
class Enqueued:
    """A parsed enqueue body."""

    prompts: list[str]
    fps: list[float]
    media: str
    """``latent`` (decode first), ``video`` (uint8 pixels) or ``image`` (uint8 images held still, ``--cosmos-image-as still``)."""
    array: np.ndarray
    """Latents [B, 16 or 48, T, h, w], or frames [B, T, H, W, 3] (an image's a read-only view of it repeated)."""
    reward_fn: dict[str, float]
    sigma_data: float = 1.0
    refused: dict[int, str] = field(default_factory=dict)
    """Rollouts that get no score, by index, and why (latents that are not finite; the decoder adds those
    whose decoded frames are not finite): each gets the fallback score and its reason in the pull answer."""

    @property
    def batch(self) -> int:
        return len(self.prompts)

    def decoded_bytes(self, decoder=None) -> int:
        """The memory decoding it takes at its peak (admitted before any decoding): ``decoder.peak_bytes``,
        the VAE's activations included, or the decoded frames alone without a decoder."""
        if self.media == "latent":
            shape = tuple(self.array.shape)
            spatial = SPATIAL_OF.get(shape[1], SPATIAL_OF[CHANNELS])
            return decoder.peak_bytes(shape) if decoder is not None else decoded_bytes(shape, spatial)
        return int(self.array.size)


def _split(raw: bytes) -> tuple[bytes, memoryview]:
    cut = raw.find(b"\n")
    if cut < 0:
        raise RequestError("enqueue body", "is not JSON, a newline and .npy bytes (no newline found)")
    return raw[:cut], memoryview(raw)[cut + 1 :]


def _array(view: memoryview, media: str, limits, channels: int = CHANNELS) -> np.ndarray:
    descr, fortran, shape, offset = npy_header(view, "enqueue array")
    if media == "image":  # cosmos-rl's image rollouts: uint8 [B, H, W, 3], each one frame
        if descr not in _UINT8 or len(shape) != 4 or shape[-1] != 3:
            raise RequestError("enqueue array", f"images must be uint8 [B, H, W, 3], the .npy declares dtype {descr!r} and shape {shape}")
        shape = (shape[0], 1, *shape[1:])
    if media == "latent":
        if descr not in _FLOAT:
            raise RequestError("enqueue array", f"latents must be float32 or float16, the .npy declares dtype {descr!r}")
        if len(shape) == 5 and shape[1] in SPATIAL_OF and shape[1] != channels:
            family = "Wan2.2 / Cosmos" if shape[1] == 48 else "Wan2.1"
            raise RequestError("enqueue array", f"sends {shape[1]}-channel latents ({family}); this server's --latent-decoder is a "
                               f"{channels}-channel VAE: start it with a {family.split(' ')[0]} VAE")
        if len(shape) != 5 or shape[1] != channels:
            s = SPATIAL_OF[channels]
            raise RequestError("enqueue array", f"latents must have shape [B, {channels}, T, H/{s}, W/{s}], the .npy declares {shape}")
        b, _, t, h, w = shape
        limits.check_source(w * SPATIAL_OF[channels], h * SPATIAL_OF[channels], "enqueue latents (decoded)")
        frames = frames_of(t) if t else 0
        dtype = np.dtype(_FLOAT[descr])
    else:
        if descr not in _UINT8:
            raise RequestError("enqueue array", f"video frames must be uint8, the .npy declares dtype {descr!r}")
        if len(shape) != 5 or 3 not in (shape[-1], shape[1]):
            raise RequestError("enqueue array", f"video frames must have shape [B, T, H, W, 3] or [B, 3, T, H, W], the .npy declares {shape}")
        b, t = shape[0], shape[1] if shape[-1] == 3 else shape[2]
        h, w = (shape[2], shape[3]) if shape[-1] == 3 else (shape[3], shape[4])
        limits.check_source(w, h, "enqueue frames")
        frames, dtype = t, np.dtype(np.uint8)
    if b < 1 or t < 1:
        raise RequestError("enqueue array", f"holds no video (shape {shape})")
    if frames > limits.max_context_samples * 64:  # far more frames than any context and candidate can use
        raise RequestError("enqueue array", f"decodes to {frames} frames per video; at most {limits.max_context_samples * 64} are taken",
                           code=ErrorCode.TOO_LARGE)
    declared = math.prod(shape) * dtype.itemsize
    body = len(view) - offset
    if declared != body:
        raise RequestError("enqueue array", f"the .npy declares shape {shape} ({declared} bytes) but carries {body} bytes")
    arr = np.frombuffer(view, dtype=dtype, count=math.prod(shape), offset=offset)
    return arr.reshape(shape, order="F" if fortran else "C")


def _reward_weights(fns: Any, names: tuple[str, ...] = REWARD_NAMES) -> dict[str, float]:
    """``reward_fn``: reward name -> weight, each weight a finite number, each name a served model (``names``).

    As in cosmos-rl 0.4.7's own reward service, a weight never scales a score: each named reward is
    computed on the one decode and pulled raw by its ``type``; the client (``RemoteRewardCalculator.fetch_reward``)
    pulls every configured name, whatever its weight, and adds ``clip(score) * weight`` itself. Unlike
    that service, which drops a name of weight <= 0 (its pull then never finds a score), every named
    model is scored, 0 and negative weights included, so each pull the client makes is answered. A weight
    that is not a number, or NaN or infinite (which would make the trainer's total NaN), is refused; so is
    a name this server does not serve, even at weight 0, since cosmos-rl would pull it anyway."""
    if not isinstance(fns, dict) or not fns:
        raise RequestError("enqueue JSON 'reward_fn'", "must be an object of reward name -> weight")
    weights = {}
    for name, w in fns.items():
        try:
            ok = not isinstance(w, bool) and isinstance(w, (int, float)) and math.isfinite(float(w))
        except OverflowError:  # an integer beyond float range
            ok = False
        if not ok:
            raise RequestError(f"enqueue JSON 'reward_fn'[{name[:40]!r}]",
                               f"is {repr(w)[:40]}; a weight is a finite number (cosmos-rl multiplies the pulled score by it)")
        weights[name] = float(w)
    other = sorted(set(weights) - set(names))
    if other:
        hint = f" (set reward_fn to '{names[0]}')" if len(names) == 1 else " (each reward_fn name is a --model NAME of this server)"
        raise RequestError("enqueue JSON 'reward_fn'",
                           f"asks for {', '.join(o[:40] for o in other[:8])}; this server computes {', '.join(names)}{hint}")
    return weights


def parse_enqueue(raw: bytes, limits, *, has_decoder: bool, rules: MediaRules | None = None) -> Enqueued:
    """An enqueue body, refused with a 400 (``RequestError``) naming what is wrong before anything is decoded.
    ``rules`` (``media_rules``): what images become and the decoder's latent channels (default: images refused, Wan2.1)."""
    rules = rules or MediaRules(latent_channels=CHANNELS if has_decoder else None)
    head, tail = _split(raw)
    payload = parse_json(head, max(1, limits.max_request_items), "enqueue JSON")
    if not isinstance(payload, dict):
        raise RequestError("enqueue JSON", "must be an object with prompts, reward_fn and video_infos")
    prompts = payload.get("prompts")
    if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
        raise RequestError("enqueue JSON 'prompts'", "must be a non-empty list of strings, one per video")
    if len(prompts) > limits.max_request_items:
        raise RequestError("enqueue JSON 'prompts'", f"has {len(prompts)} videos; the limit is {limits.max_request_items} per request",
                           code=ErrorCode.TOO_LARGE)
    weights = _reward_weights(payload.get("reward_fn", {rules.names[0]: 1.0}), rules.names)
    media = payload.get("media_type") or "latent"  # the legacy path sends none: latents
    if media == "image" and rules.image_as == "refuse":
        raise RequestError("enqueue JSON 'media_type'", "is 'image': a still image is not a 5 s continuation, so NVRM has no reward "
                           "for it; send 'video' or 'latent' rollouts, or start the server with --cosmos-image-as still "
                           "to score each image held still (flagged)")
    if media not in ("latent", "video", "image"):
        raise RequestError("enqueue JSON 'media_type'", f"is {media!r}; this server takes 'latent' (Wan latents) or 'video' (uint8 frames)")
    if media == "latent" and not has_decoder:
        raise RequestError("enqueue", "sends latents, and this server has no latent decoder; start it with --latent-decoder PATH "
                           "(a Wan2.1 VAE, or a Wan2.2 VAE for 48-channel latents), or send media_type 'video' with uint8 frames")
    infos = payload.get("video_infos") or [{}] * len(prompts)
    if not isinstance(infos, list) or len(infos) != len(prompts) or not all(isinstance(i, dict) for i in infos):
        raise RequestError("enqueue JSON 'video_infos'", f"must be a list of {len(prompts)} objects, one per video")
    fps = []
    for i, info in enumerate(infos):
        f = info.get("video_fps", 16.0)
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not limits.min_fps <= f <= limits.max_fps:
            raise RequestError(f"enqueue JSON 'video_infos'[{i}].video_fps", f"is {f!r}; a frame rate between {limits.min_fps} and {limits.max_fps} is needed")
        fps.append(float(f))
    sigma = payload.get("sigma_data", 1.0)
    lo, hi = SIGMA_DATA_RANGE
    if isinstance(sigma, bool) or not isinstance(sigma, (int, float)) or not lo <= sigma <= hi:
        raise RequestError("enqueue JSON 'sigma_data'", f"is {sigma!r}; between {lo:g} and {hi:g} is taken (cosmos-rl's trainers use 1.0, or 0.5 for EDM)")
    array = _array(tail, media, limits, rules.latent_channels or CHANNELS)
    if media == "image":  # held still: the context frames, then the candidate's length at the fastest rollout's rate
        held = rules.context_frames + math.ceil(rules.candidate_seconds * max(fps))
        array = np.broadcast_to(array, (array.shape[0], held, *array.shape[2:]))
    if array.shape[0] != len(prompts):
        raise RequestError("enqueue array", f"holds {array.shape[0]} videos for {len(prompts)} prompts")
    refused = non_finite(array) if media == "latent" else {}
    if len(refused) == len(prompts):  # nothing left to score: the whole body is refused
        raise RequestError("enqueue array", f"has no rollout to score: {refused[0]}" + (f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""))
    return Enqueued(prompts, fps, media, array, weights, float(sigma), refused)


def non_finite(latents: np.ndarray) -> dict[int, str]:
    """Rollouts of ``latents`` [B, ...] holding NaN or infinite values, by index, and how many such values each holds."""
    out = {}
    for i in range(latents.shape[0]):
        bad = latents[i].size - int(np.count_nonzero(np.isfinite(latents[i])))
        if bad:
            out[i] = f"rollout {i}: its latents are not finite ({bad} NaN or infinite values); it is not scored"
    return out


def frames_view(frames: np.ndarray) -> np.ndarray:
    """uint8 frames as [B, T, H, W, 3] (a [B, 3, T, H, W] array transposed)."""
    return frames if frames.shape[-1] == 3 else frames.transpose(0, 2, 3, 4, 1)


@dataclass
class RolloutScores:
    """One enqueue's outcome: each rollout's reward or why it has none, kept until pulled (and then until its TTL)."""

    rewards: list[float | None]
    errors: dict[int, str]
    info: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    decode_seconds: float | None = None
    models: dict[str, "RolloutScores"] = field(default_factory=dict)
    """Each ``reward_fn`` name's own outcome (the same decoded frames scored by that model); empty for a job
    that failed as a whole, whose outcome answers every name. The fields above are the first name's."""

    def computed(self) -> list[str]:
        """The names this outcome answers (empty: any, a job failed as a whole)."""
        return list(self.models)

    def answer(self, kind: str, fallback: float) -> dict[str, Any]:
        """The pull answer of ``kind`` (a ``reward_fn`` name; empty: the first): every key a list of B floats in
        request order; a failed item scores ``fallback`` and is named in ``errors`` (never a silent number)."""
        if self.models and kind in self.models:
            own = self.models[kind]
            return RolloutScores(own.rewards, own.errors, own.info, self.seconds, self.decode_seconds).answer(kind, fallback)
        filled = [fallback if r is None else float(r) for r in self.rewards]
        return {
            "scores": {key: filled for key in SCORE_KEYS},
            "errors": [{"index": i, "error": self.errors[i]} for i in sorted(self.errors)],
            "failed": sorted(self.errors),
            "input_info": self.info,
            "duration": f"{self.seconds:.3f}",
            "decoded_duration": "N/A" if self.decode_seconds is None else f"{self.decode_seconds:.3f}",
            "type": kind,
            **({"flagged": STILL_FLAG} if self.info.get("media_type") == "image" else {}),
        }

    def to_json(self) -> dict[str, Any]:
        """The outcome as the JSON the job stores keep."""
        return {"rewards": self.rewards, "errors": {str(k): v for k, v in self.errors.items()}, "info": self.info, "seconds": self.seconds,
                "decode_seconds": self.decode_seconds, "models": {n: m.to_json() for n, m in self.models.items()}}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "RolloutScores":
        """The outcome ``to_json`` wrote."""
        return cls(d["rewards"], {int(k): v for k, v in d["errors"].items()}, d["info"], d["seconds"], d["decode_seconds"],
                   {n: cls.from_json(m) for n, m in d.get("models", {}).items()})
