"""``nvrm bench --workload vision``: the vision path before and after, on N equal-size frames.

- before: the bundle's image processor on the contract frames (float32
  pixel values, what the workers used to produce and ship), then
  transformers' own vision tower (per-image attention, tables rebuilt per
  call);
- after: the codec's uint8 patches normalised on the device, then
  ``VisionEncoder`` (batched attention, cached tables).

Reported separately for the tower alone and for frames -> features, with
the largest difference of the features (0 = bit-identical).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from PIL import Image

from ..engine.chat import images_kwargs
from .harness import build_bench_bundle, device_name, sync


def _best(fn, device, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        sync(device)
        t = time.perf_counter()
        fn()
        sync(device)
        best = min(best, time.perf_counter() - t)
    return best


@torch.inference_mode()
def run_vision(arch: str = "mid", frames: int = 80, size: tuple[int, int] = (192, 352), device: str | None = None, repeats: int = 3) -> dict[str, Any]:
    from ..scoring.reward_model import RewardModel

    bundle = build_bench_bundle(arch)
    model = RewardModel.from_pretrained(bundle, device=device, workers=0)
    dev = model.device
    try:
        rng = np.random.default_rng(0)
        images = [Image.fromarray(rng.integers(0, 256, (size[0], size[1], 3), dtype=np.uint8)) for _ in range(frames)]
        processor, codec, visual = model.processor, model.engine.codec, model.backbone.visual
        processed = processor.image_processor(images=images, return_tensors="pt", **images_kwargs(model.contract))
        pixel_values, grid = processed["pixel_values"].to(dev), processed["image_grid_thw"]
        patches, grid2 = codec.encode(images)
        patches = patches.to(dev)
        assert torch.equal(grid, grid2)

        def before_tower():
            return visual(pixel_values.type(visual.dtype), grid_thw=grid.to(dev))

        def after_tower():
            return model.vision(pixel_values, grid)

        def before_all():
            out = processor.image_processor(images=images, return_tensors="pt", **images_kwargs(model.contract))
            return visual(out["pixel_values"].to(dev).type(visual.dtype), grid_thw=out["image_grid_thw"].to(dev))

        def after_all():
            p, g = codec.encode(images)
            return model.vision(codec.to_pixel_values(p.to(dev)), g)

        ref, ref_deep = before_tower()
        ours, ours_deep = after_all()
        diff = max([(ref.float() - ours.float()).abs().max().item()] + [(a.float() - b.float()).abs().max().item() for a, b in zip(ref_deep, ours_deep)])
        paths = (("before_tower", before_tower), ("after_tower", after_tower), ("before_all", before_all), ("after_all", after_all))
        t = {name: _best(fn, dev, repeats) for name, fn in paths}
    finally:
        model.close()
    return {
        "workload": "vision",
        "arch": arch,
        "device": str(dev),
        "device_name": device_name(dev),
        "frames": frames,
        "frame_size": {"height": size[0], "width": size[1]},
        "seconds": t,
        "tower_speedup": t["before_tower"] / t["after_tower"],
        "frames_to_features_speedup": t["before_all"] / t["after_all"],
        "max_abs_diff": diff,
        "bit_identical": diff == 0.0,
    }


def format_vision(r: dict[str, Any]) -> str:
    t = r["seconds"]
    return "\n".join(
        [
            f"vision workload: {r['frames']} frames of {r['frame_size']['width']}x{r['frame_size']['height']}, arch={r['arch']}, "
            f"{r['device']} ({r['device_name']})",
            f"tower only:         before {t['before_tower']:.3f} s, after {t['after_tower']:.3f} s = {r['tower_speedup']:.2f}x",
            f"frames -> features: before {t['before_all']:.3f} s, after {t['after_all']:.3f} s = {r['frames_to_features_speedup']:.2f}x",
            f"max |difference| of the features: {r['max_abs_diff']:.3g} (bit-identical: {r['bit_identical']})",
        ]
    )
