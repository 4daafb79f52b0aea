"""The reward as a differentiable function of candidate pixels, with the contract's exact value.

``RewardModel.differentiable()`` returns a ``DifferentiableReward``: ``scorer(prompt, context,
frames, fps=...)`` gives rewards ``[B]`` that backpropagate to ``frames`` (float in [0, 1],
``[T, H, W, 3]`` or ``[B, T, C, H, W]``, on any device). The model's weights get no gradient.

Every step of the contract that has no gradient runs exactly, on the host, in the forward pass:
the 1 FPS choice of frames (``plan_candidate``), uint8 quantisation (``round(clamp(x, 0, 1) * 255)``,
the rule the RL adapters apply; frames further than 0.5 outside [0, 1] are refused, ``nvrm.clip.float_range_problem``),
the height-360 Pillow bicubic resize, the JPEG q85 round trip and the smart resize (``prepare_frame``). The
gradient flows through a surrogate instead: the same two resizes as antialiased bicubic interpolation in torch,
and identity through JPEG and quantisation.
The two are joined straight-through, ``exact + (surrogate - surrogate.detach())``, whose value is
``exact`` bit for bit, so the reward equals ``score`` on the quantised frames bit for bit (CPU).

Frames the plan does not sample get a zero gradient. The context is prepared and prefilled once per
(prompt, context) without gradient (the last few are kept: a path by its text, which is read once, any
other input by identity); the candidates of a call run against it as ``score_group`` runs them. Activation checkpointing over the vision blocks
and the text layers is on by default; gradients are the same with it off.

Shapes: B candidates, T frames, n sampled frames, H x W source size, h x w contract size.
"""

from __future__ import annotations

import logging
import math
import os
from collections import OrderedDict
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from ..clip import float_range_problem
from ..errors import ConfigError, InputError
from ..forward.backprop import suffix_rewards
from ..forward.pixels import levels_to_pixel_values
from ..forward.prefix import Prefix, prefill
from ..video.inputs import PreparedVideo
from ..video.frames import height_resized_width, prepare_frame
from ..video.sampling import plan_candidate
from .streaming import off_contract_reasons

log = logging.getLogger(__name__)


def as_videos(frames: Any) -> torch.Tensor:
    """``frames`` as float ``[B, T, H, W, 3]`` (a view where possible), or an ``InputError`` naming the problem."""
    if not isinstance(frames, torch.Tensor):
        raise InputError("frames", f"must be a torch tensor (float in [0, 1]), got {type(frames).__name__}")
    if not frames.dtype.is_floating_point:
        raise InputError("frames", f"are {str(frames.dtype).replace('torch.', '')}; pass float values in [0, 1] (divide uint8 frames by 255)")
    if frames.ndim == 4 and frames.shape[-1] == 3:
        videos = frames.unsqueeze(0)
    elif frames.ndim == 5 and frames.shape[2] == 3:
        videos = frames.permute(0, 1, 3, 4, 2)
    else:
        raise InputError("frames", f"have shape {tuple(frames.shape)}; pass [T, H, W, 3] or [B, T, C=3, H, W]")
    if videos.shape[0] == 0:
        raise InputError("frames", f"have shape {tuple(frames.shape)}: a batch of no candidates; pass at least one")
    if videos.shape[1] == 0 or videos.shape[2] == 0 or videos.shape[3] == 0:
        raise InputError("frames", f"have shape {tuple(frames.shape)}, with no frames or no pixels")
    # one reduction, no full-size temporaries (a [B, 81, 3, 480, 832] batch is 1.2 GB); a non-finite
    # sum is confirmed frame by frame (huge finite values can overflow it)
    if not bool(torch.isfinite(frames.detach().sum())) and not all(bool(torch.isfinite(videos[:, t].detach()).all()) for t in range(videos.shape[1])):
        raise InputError("frames", "contain NaN or infinite values")
    if (why := float_range_problem(*(float(x) for x in torch.aminmax(frames.detach())))):  # one more reduction: 0..255 or [-1, 1] frames
        raise InputError("frames", why)
    return videos


def quantize(x: torch.Tensor) -> torch.Tensor:
    """The uint8 frames ``score`` sees for float frames in [0, 1] (an overshoot of up to 0.5, all ``as_videos`` lets through, is clamped)."""
    return (x.detach().float().clamp(0, 1) * 255).round().to(torch.uint8)


def surrogate(frames: torch.Tensor, size: tuple[int, int], contract: Any) -> torch.Tensor:
    """[n, H, W, 3] in 0..255 -> [n, h, w, 3]: the contract's two resizes, differentiable (antialiased bicubic)."""
    n, H, W, _ = frames.shape
    x = frames.permute(0, 3, 1, 2)
    x = F.interpolate(x, size=(contract.resize_height, height_resized_width(W, H, contract)), mode="bicubic", antialias=True, align_corners=False)
    x = F.interpolate(x, size=size, mode="bicubic", antialias=True, align_corners=False)
    return x.permute(0, 2, 3, 1)


def patchify(levels: torch.Tensor, patch: int, merge: int) -> torch.Tensor:
    """[h, w, 3] pixel levels -> [h/ps * w/ps, 3 * ps * ps] in the processor's patch order (``PixelCodec.patchify``)."""
    h, w, _ = levels.shape
    gh, gw = h // patch, w // patch
    x = levels.reshape(gh // merge, merge, patch, gw // merge, merge, patch, 3)
    return x.permute(0, 3, 1, 4, 6, 2, 5).reshape(gh * gw, 3 * patch * patch)


class DifferentiableReward(torch.nn.Module):
    """``forward(prompt, context, frames, *, fps) -> rewards [B]`` with gradients to ``frames``."""

    KEEP = 8
    """Contexts (and prefilled prefixes) kept for later calls: a ReFL step cycles through a few."""

    def __init__(self, model, *, checkpointing: bool = True, conservative: float | None = None):
        super().__init__()
        if model.engine.codec is None:
            raise ConfigError("the differentiable reward needs the exact pixel codec, and this bundle's processor has none (see the load log)")
        from ..guard.conservative import check_conservative

        self.model = model
        self.checkpointing = checkpointing
        self.conservative = check_conservative(conservative, getattr(model, "guard", None), "differentiable(conservative=...)")
        """λ: the call returns ``reward - λ * uncertainty`` (None: the raw reward)."""
        self.raw: torch.Tensor | None = None
        """The last call's raw rewards [B] (with their graph)."""
        self.uncertainty: torch.Tensor | None = None
        """The last call's uncertainties [B] (with their graph), when the bundle has a guard; else None."""
        self._contexts: OrderedDict[Any, tuple[Any, PreparedVideo]] = OrderedDict()
        """Prepared contexts by key (a path's text, else the object's identity), the last few kept."""
        self._prefixes: OrderedDict[tuple, Prefix] = OrderedDict()
        """Prefilled prefixes by their token ids, the last few kept (each holds the context's KV)."""
        self.off_contract: list[tuple[str, ...]] = []
        """Per candidate of the last call: the contract opt-ins its reward used (no context, a short
        candidate), empty for a release-contract reward; each distinct reason is also logged once."""
        self._reported: set[str] = set()
        self._freeze(first=True)

    def _freeze(self, first: bool = False) -> None:
        """The weights are constants here: no gradient, never modified (again at every call, should a caller
        have switched ``requires_grad`` on since)."""
        runtimes = [self.model.runtime, *(m.runtime for m in getattr(self.model, "members", ()))]
        thawed = [p for rt in runtimes for p in list(rt.backbone.parameters()) + list(rt.head.parameters()) if p.requires_grad]
        if thawed and not first and "frozen" not in self._reported:
            self._reported.add("frozen")
            log.warning("the differentiable reward switched requires_grad off again on %d reward-model parameters: its weights get no gradient", len(thawed))
        for p in thawed:
            p.requires_grad_(False)

    def prepare_candidates(self, frames: Any, fps: float) -> tuple[torch.Tensor, list[PreparedVideo], Any]:
        """(the sampled frames [B, n, H, W, 3] with their graph, their exact contract forms, the plan)."""
        model = self.model
        videos = as_videos(frames)
        if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not math.isfinite(fps) or fps <= 0:
            raise InputError(f"fps {fps!r}", "is not a positive number; pass the frame rate of the frames")
        model.limits.check_fps(float(fps), "frames")
        B, T, H, W, _ = videos.shape
        model.limits.check_source(W, H, "frames")
        plan = plan_candidate([k / fps for k in range(T)], model.contract, f"frames ({T} at {fps:g} fps)", 1.0 / fps)
        sampled = videos[:, list(plan.indices)]
        exact = quantize(sampled).cpu().numpy()  # the host round trip the exact branch needs
        prepared = []
        for b in range(B):
            images = tuple(prepare_frame(Image.fromarray(exact[b, k]), model.contract, f"frames[{b}] @ {t:.3f}s") for k, t in enumerate(plan.times))
            prepared.append(PreparedVideo(images, plan.times, f"frames[{b}]", "candidate", model.contract.fingerprint))
        return sampled, prepared, plan

    def _context_of(self, context: Any) -> PreparedVideo:
        key = ("path", os.fspath(context)) if isinstance(context, (str, os.PathLike)) else ("object", id(context))
        held = self._contexts.get(key)
        if held is None:  # the object is held with its preparation, so its id cannot be reused meanwhile
            held = self._contexts[key] = (context, self.model.prepare_video(context, "context"))
            while len(self._contexts) > self.KEEP:
                self._contexts.popitem(last=False)
        self._contexts.move_to_end(key)
        return held[1]

    def _prefix_of(self, enc: Any, member: str | None = None) -> Prefix:
        key = (tuple(enc.ids[0][: enc.prefix_len].tolist()), member)
        prefix = self._prefixes.get(key)
        if prefix is None or not prefix.matches(enc):
            prefix = self._prefixes[key] = Prefix.of(enc)
            while len(self._prefixes) > self.KEEP * (1 + len(getattr(self.model, "members", ()))):
                self._prefixes.popitem(last=False)
        self._prefixes.move_to_end(key)
        return prefix

    def forward(self, prompt: str, context: Any, frames: Any, *, fps: float) -> torch.Tensor:
        """Rewards [B] of the candidates ``frames`` (at ``fps``) after ``prompt`` and ``context``."""
        model = self.model
        self._freeze()
        sampled, prepared, _ = self.prepare_candidates(frames, fps)
        context_video = self._context_of(context)
        self.off_contract = [off_contract_reasons(context_video, video, model.contract) for video in prepared]
        for reason in sorted({r.split(":")[0] for rs in self.off_contract for r in rs} - self._reported):
            self._reported.add(reason)
            log.warning("differentiable reward: %s (off the release contract; see .off_contract)", reason)
        enc = model.engine.encode_group(prompt, context_video, prepared)
        codec, device = model.engine.codec, model.runtime.device
        pixel_values, patch_levels = [], []
        for b, video in enumerate(prepared):
            size = (video.images[0].height, video.images[0].width)  # one source size: one contract size
            exact = torch.from_numpy(np.stack([np.asarray(im) for im in video.images])).to(device=device, dtype=torch.float32)
            s = surrogate(sampled[b].float().clamp(0, 1) * 255, size, model.contract).to(device)
            levels = exact + (s - s.detach())  # value: exact, bit for bit; gradient: the surrogate's
            patches = torch.cat([patchify(levels[k], codec.patch_size, codec.merge_size) for k in range(len(video.images))])
            if not torch.equal(patches.detach().to(torch.uint8).cpu(), enc.candidate_pixels[b]):  # pragma: no cover - a layout bug
                raise RuntimeError("the differentiable patches differ from the engine's")
            pixel_values.append(levels_to_pixel_values(patches, codec))
            patch_levels.append(patches)
        return self.rewards_of(enc, pixel_values, patch_levels)

    def rewards_of(self, enc: Any, pixel_values: list[torch.Tensor], patches: list[torch.Tensor] | None = None) -> torch.Tensor:
        """Rewards [G] of an engine-encoded group whose candidates' pixel values are ``pixel_values`` (the
        differentiable part: pixel values -> reward), conservative ones when asked. The prefix is prefilled once,
        without gradient. ``patches``: the candidates' 0..255 patches with their graph, which the guard's frame
        statistics read (default: the engine's, without gradient)."""
        model = self.model
        guard = getattr(model, "guard", None)
        tap = model.runtime.tap() if guard is not None else None
        rewards = self._rewards(model.runtime, None, enc, pixel_values, tap)
        bad = [g for g, ok in enumerate(torch.isfinite(rewards.detach()).tolist()) if not ok]
        if bad:  # never a non-finite number passed on as a reward
            from ..errors import ModelError

            raise ModelError(f"candidate(s) {bad}: the model returned a non-finite reward; its weights are broken (check the bundle with nvrm verify)")
        self.raw, self.uncertainty = rewards, None
        if tap is None:
            return rewards
        from ..guard.reading import read

        G = len(enc.ids)
        cands = [(patches[g] if patches is not None else enc.candidate_pixels[g], enc.candidate_grids[g]) for g in range(G)]
        reading = read([tap.frames[g] for g in range(G)], [tap.last[g] for g in range(G)], rewards, cands,
                       [(enc.context_pixels, enc.context_grid)] * G, model.engine.codec.patch_size)
        self.uncertainty = guard.uncertainty(reading)
        every = getattr(getattr(model, "settings", None), "members", False)  # a member_rate is the monitor's alone
        members = getattr(model, "members", ()) if every else ()
        if members:  # the opt-in check: each member's reward of the same pixel values, with its graph (nvrm.guard.members)
            from ..guard.members import doubt

            calibrated = torch.stack([m.bar(self._rewards(m.runtime, m.name, enc, pixel_values, None)) for m in members])
            self.uncertainty = doubt(self.uncertainty, rewards, calibrated.to(rewards.dtype))
        return rewards if self.conservative is None else rewards - self.conservative * self.uncertainty

    def _rewards(self, runtime: Any, member: str | None, enc: Any, pixel_values: list[torch.Tensor], tap: Any) -> torch.Tensor:
        """Rewards [G] of ``runtime``'s backbone and head (the bundle's, or member ``member``'s) against their own prefilled prefix."""
        prefix = self._prefix_of(enc, member)
        kw = {"device": runtime.device, "vision": runtime.vision, "normalize_hidden": runtime.normalize_hidden}
        for row in prefix.missing(enc):
            prefill(runtime.backbone, runtime.head, prefix, enc, row, **kw)
        by_length: dict[int, list[int]] = {}
        for g, ids in enumerate(enc.ids):
            by_length.setdefault(int(ids.shape[0]), []).append(g)
        out: list[Any] = [None] * len(enc.ids)
        for rows in by_length.values():
            part = suffix_rewards(
                runtime.backbone, runtime.head, prefix, enc.select(rows), [pixel_values[g] for g in rows], checkpoint=self.checkpointing,
                tap=tap.view(rows) if tap is not None else None, **kw
            )
            for g, r in zip(rows, part):
                out[g] = r
        return torch.stack(out)
