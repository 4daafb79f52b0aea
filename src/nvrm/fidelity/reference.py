"""A deliberately plain reference implementation of the release contract.

It shares no code with the runtime's preprocessing: it decodes every frame,
picks frames with ``argmin``, resizes/JPEG-encodes with Pillow directly, calls
``qwen_vl_utils.fetch_image`` and the bundle's ``AutoProcessor``, and runs a
``Qwen3VLModel`` loaded by transformers' own ``from_pretrained``. Parity tests
compare the runtime against it, and ``nvrm bench`` uses it as the naive path.
"""

from __future__ import annotations

import io
from pathlib import Path

import av
import numpy as np
import torch
from PIL import Image
from qwen_vl_utils import fetch_image
from safetensors.torch import load_file

from ..contract import Contract


def decode_all(path: str | Path) -> tuple[list[float], list[Image.Image], float | None]:
    """Every frame of the first video stream: (times from first frame, RGB images, nominal interval)."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        rate = stream.average_rate or stream.guessed_rate
        frames = [(float(f.pts * f.time_base), f.to_image()) for f in container.decode(stream)]
    t0 = frames[0][0]
    return [t - t0 for t, _ in frames], [im for _, im in frames], (1.0 / float(rate) if rate else None)


def sample(times: list[float], nominal: float | None, role: str, contract: Contract) -> list[int]:
    n = len(times)
    interval = (times[-1] - times[0]) / (n - 1) if n > 1 else (nominal or 0.0)
    duration = times[-1] + interval
    if role == "candidate":
        if duration + interval / 2 < contract.candidate_seconds - 1e-9:
            raise ValueError(f"candidate too short: {duration}")
        ticks = [k / contract.sample_fps for k in range(contract.candidate_frames)]
    else:
        ticks = []
        k = 0
        while k == 0 or k / contract.sample_fps < duration - 1e-9:
            ticks.append(k / contract.sample_fps)
            k += 1
        if contract.max_context_frames:
            ticks = ticks[-contract.max_context_frames :]
    t = np.asarray(times)
    out = []
    for tick in ticks:  # first frame within float noise of the minimum distance = the earlier on a tie
        d = np.abs(t - tick)
        out.append(int(np.flatnonzero(d <= d.min() + 1e-9)[0]))
    return out


def contract_image(image: Image.Image, contract: Contract) -> Image.Image:
    w, h = image.size
    image = image.convert("RGB").resize((round(w * contract.resize_height / h), contract.resize_height), Image.BICUBIC)
    buf = io.BytesIO()
    image.save(buf, format="JPEG", quality=contract.jpeg_quality)
    image = Image.open(io.BytesIO(buf.getvalue())).convert("RGB")
    return fetch_image(
        {"image": image, "min_pixels": contract.min_pixels, "max_pixels": contract.max_pixels},
        image_patch_size=contract.patch_size,
    )


def reference_images(path: str | Path, role: str, contract: Contract) -> tuple[list[Image.Image], list[float]]:
    times, images, nominal = decode_all(path)
    idx = sample(times, nominal, role, contract)
    return [contract_image(images[i], contract) for i in idx], [times[i] for i in idx]


def reference_frames(frames, fps: float | None, role: str, contract: Contract) -> tuple[list[Image.Image], list[float]]:
    """In-memory RGB frames (uint8 ``(H, W, 3)`` arrays) at ``fps`` through the same plain steps as a file;
    ``fps=None`` is a single image (a context of one frame at time 0)."""
    images = [Image.fromarray(np.asarray(f, dtype=np.uint8)) for f in frames]
    times = [i / fps for i in range(len(images))] if fps else [0.0] * len(images)
    idx = sample(times, (1.0 / fps) if fps else None, role, contract)
    return [contract_image(images[i], contract) for i in idx], [times[i] for i in idx]


def load_reference_model(bundle: str | Path):
    """transformers' own loader, strictly: ``Qwen3VLForConditionalGeneration.from_pretrained`` maps both the
    bare (``language_model.*``) and the prefixed (``model.language_model.*``) key layouts; any weight it would
    leave newly initialised, or not use, is an error that names the keys."""
    from transformers import Qwen3VLForConditionalGeneration

    full, info = Qwen3VLForConditionalGeneration.from_pretrained(str(bundle), dtype=torch.bfloat16, output_loading_info=True)
    problems = []
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        keys = sorted(str(k) for k in info.get(kind, []) if not str(k).startswith("lm_head."))
        if keys:
            problems.append(f"{kind.replace('_', ' ')}: {', '.join(keys[:5])}" + (f" (+{len(keys) - 5} more)" if len(keys) > 5 else ""))
    # transformers does not report a tied weight (embed_tokens <-> lm_head) it could not load: it stays on meta
    meta = sorted(n for n, t in [*full.model.named_parameters(), *full.model.named_buffers()] if t.is_meta)
    if meta:
        problems.append(f"missing keys: {', '.join(meta[:5])}" + (f" (+{len(meta) - 5} more)" if len(meta) > 5 else ""))
    if problems:
        raise ValueError(f"{bundle}: the reference would run with weights that are not the bundle's: " + "; ".join(problems))
    return full.model


class ReferenceScorer:
    """transformers' own loader + processor + a plain forward, one item at a time."""

    def __init__(self, bundle: str | Path, contract: Contract | None = None, device: str = "cpu"):
        from transformers import AutoProcessor

        from ..forward.cpu_attention import ensure_cpu_sdpa

        ensure_cpu_sdpa()
        self.contract = contract or Contract.for_bundle(bundle)
        self.processor = AutoProcessor.from_pretrained(str(bundle))
        if self.processor.chat_template is None:  # the template only in tokenizer_config.json
            self.processor.chat_template = self.processor.tokenizer.chat_template
        self.model = load_reference_model(bundle).to(device).eval()
        head = load_file(str(Path(bundle) / "nvrm_head.safetensors"))
        self.weight = head["rm_head.weight"].to(device, torch.bfloat16)
        self.bias = head.get("rm_head.bias")
        if self.bias is not None:
            self.bias = self.bias.to(device, torch.bfloat16)
        self.device = device

    def inputs(self, prompt: str, context: list[Image.Image], candidate: list[Image.Image]):
        c = self.contract
        content = [{"type": "text", "text": c.context_header.replace("{prompt}", prompt)}]
        content += [{"type": "image", "image": im} for im in context]
        content += [{"type": "text", "text": c.candidate_header}]
        content += [{"type": "image", "image": im} for im in candidate]
        text = self.processor.apply_chat_template(
            [{"role": "user", "content": content}],
            tokenize=False,
            add_generation_prompt=c.add_generation_prompt,
            enable_thinking=c.enable_thinking,
        )
        return self.processor(
            text=[text],
            images=context + candidate,
            return_tensors="pt",
            images_kwargs={"min_pixels": c.min_pixels, "max_pixels": c.max_pixels},
        )

    @torch.inference_mode()
    def reward(self, inputs) -> float:
        inputs = {k: v.to(self.device) for k, v in inputs.items()}
        out = self.model(**inputs)
        last = out.last_hidden_state[0, -1:]
        return float(torch.nn.functional.linear(last, self.weight, self.bias)[0].float())

    def score_files(self, prompt: str, context: str | Path, candidate: str | Path) -> float:
        ctx, _ = reference_images(context, "context", self.contract)
        cand, _ = reference_images(candidate, "candidate", self.contract)
        return self.reward(self.inputs(prompt, ctx, cand))
