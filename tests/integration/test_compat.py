"""nvrm's own numerics (rope index, vision tables) and its version helpers, held against the installed transformers.

Where the installed transformers computes the same thing, the two must agree bit for bit; where it
changed the arithmetic (the vision interpolation from 5.9), the test pins down that the change is
the only difference. ``make test`` runs this file under every transformers of the matrix
(``tests/versions``).
"""

from __future__ import annotations

import inspect

import pytest
import torch

from nvrm.forward import compat
from nvrm.forward.rope import RopeSpec, rope_index
from nvrm.forward.vision import VisionEncoder
from nvrm.forward import vision_tables


@pytest.fixture(scope="module")
def backbone(tiny_bundle):
    from nvrm.bundle.load import load_backbone, read_config

    return load_backbone(tiny_bundle, read_config(tiny_bundle), torch.bfloat16)


def _sequence(spec: RopeSpec, grids, texts=(5, 3, 0, 7, 2)):
    """Token ids: text, then per image <vision_start> image tokens <vision_end>, then text."""
    ids = list(range(10, 10 + texts[0]))
    for i, (t, h, w) in enumerate(grids):
        ids += [spec.vision_start_token_id] + [spec.image_token_id] * (t * h * w // spec.spatial_merge_size**2) + [spec.image_token_id + 1000]
        ids += list(range(20, 20 + texts[(i + 1) % len(texts)]))
    return torch.tensor(ids)


GRIDS = [[(1, 4, 6)], [(1, 4, 6), (1, 8, 2), (1, 2, 2)], [(1, 2, 30), (1, 30, 2)], []]


def _transformers_rope(backbone, ids: torch.Tensor, grids: torch.Tensor) -> torch.Tensor:
    params = inspect.signature(type(backbone).get_rope_index).parameters
    image_grids = grids if len(grids) else None
    if "mm_token_type_ids" in params:  # 5.x: the caller marks image tokens
        types = (ids == backbone.config.image_token_id).to(torch.int32).unsqueeze(0)
        pos, _ = backbone.get_rope_index(ids.unsqueeze(0), types, image_grids, None, None)
    else:
        pos, _ = backbone.get_rope_index(ids.unsqueeze(0), image_grids, None, None)
    return pos[:, 0]


@pytest.mark.parametrize("grids", GRIDS, ids=["one", "three", "thin", "text-only"])
def test_rope_index_equals_transformers(backbone, grids):
    spec = RopeSpec.from_config(backbone.config)
    ids = _sequence(spec, grids)
    g = torch.tensor(grids, dtype=torch.long).reshape(-1, 3)
    ours = rope_index(ids, g, spec)
    assert ours.dtype == torch.long and ours.shape == (3, len(ids))
    assert torch.equal(ours, _transformers_rope(backbone, ids, g))


def test_rope_index_refuses_what_it_does_not_encode(backbone):
    spec = RopeSpec.from_config(backbone.config)
    ids = _sequence(spec, [(1, 4, 4)])
    with pytest.raises(ValueError, match="1 images for 2 image grids"):
        rope_index(ids, torch.tensor([[1, 4, 4], [1, 4, 4]]), spec)
    video = ids.clone()
    video[ids == spec.image_token_id] = spec.video_token_id
    with pytest.raises(ValueError, match="video"):
        rope_index(video, torch.tensor([[1, 4, 4]]), spec)


def _tower_output(out):
    """(merged features, deepstack list) from the tower's return value: a tuple (4.57) or an output object (5.x)."""
    if isinstance(out, tuple):
        return out[0], list(out[1])
    return out.pooler_output, list(out.deepstack_features)


def _pixels(grids, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = sum(t * h * w for t, h, w in grids)
    return torch.randn((n, 3 * 2 * 16 * 16), generator=g)


def _float32_sum_interpolate(weight, grid, merge):
    """The interpolation as transformers >= 5.9 computes it: float32 weights, summed in float32, cast once."""
    t, h, w = grid
    n = int(weight.shape[0] ** 0.5)
    hi, wi = torch.linspace(0, n - 1, h), torch.linspace(0, n - 1, w)
    hf, wf = hi.int(), wi.int()
    hc, wc = (hf + 1).clip(max=n - 1), (wf + 1).clip(max=n - 1)
    dh, dw = hi - hf, wi - wf
    idx = torch.stack([(a[:, None] * n + b[None]).flatten() for a, b in ((hf, wf), (hf, wc), (hc, wf), (hc, wc))])
    wts = torch.stack([(a[:, None] * b[None]).flatten() for a, b in ((1 - dh, 1 - dw), (1 - dh, dw), (dh, 1 - dw), (dh, dw))])
    pos = (weight[idx].float() * wts[:, :, None]).sum(0).to(weight.dtype).repeat(t, 1)
    return pos.view(t, h // merge, merge, w // merge, merge, -1).permute(0, 1, 3, 2, 4, 5).flatten(0, 4)


@pytest.mark.parametrize("grids", [[(1, 4, 6)], [(1, 4, 6), (1, 6, 4), (1, 10, 14)]], ids=["one", "mixed"])
def test_vision_tower_equals_transformers_up_to_its_interpolation_change(backbone, grids, monkeypatch):
    visual = backbone.visual
    pixels, g = _pixels(grids), torch.tensor(grids)
    with torch.inference_mode():
        want, want_deep = _tower_output(visual(pixels.to(visual.dtype), grid_thw=g))
        ours, ours_deep = VisionEncoder(visual)(pixels, g)
    if compat.SHARES_RELEASE_VISION_NUMERICS:
        assert torch.equal(ours, want) and all(torch.equal(a, b) for a, b in zip(ours_deep, want_deep))
        return
    # 5.9 and later interpolate differently: close, not equal
    assert not torch.equal(ours, want), "transformers' tower agrees with 4.57.6 again: update SHARES_RELEASE_VISION_NUMERICS"
    assert (ours.float() - want.float()).abs().max() < 0.05 * want.float().abs().max()
    if compat.VERSION >= (5, 11):
        return  # 5.11 also rewrote how the source coordinates are computed
    # 5.9 and 5.10: the float32 interpolation sum is the only difference
    monkeypatch.setattr("nvrm.forward.vision.pos_embed_interpolate", _float32_sum_interpolate)
    with torch.inference_mode():
        theirs, theirs_deep = VisionEncoder(visual)(pixels, g)
    assert torch.equal(theirs, want) and all(torch.equal(a, b) for a, b in zip(theirs_deep, want_deep))


def test_the_release_interpolation_rounds_each_term():
    """4.57.6's arithmetic, step by step: float32 weights cast to bf16, four bf16 products summed left to right."""
    weight = torch.randn(64, 8, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    got = vision_tables.pos_embed_interpolate(weight, (1, 4, 6), 2)
    assert got.dtype == torch.bfloat16 and got.shape == (24, 8)
    f32 = _float32_sum_interpolate(weight, (1, 4, 6), 2)
    assert not torch.equal(got, f32)  # the two roundings differ on this table
    assert (got.float() - f32.float()).abs().max() < 0.1


def test_eager_vision_attention_matches_transformers_eager(tiny_bundle):
    """The eager fallback is nvrm's own too: it equals transformers' eager tower where the interpolation agrees."""
    from nvrm.bundle.load import load_backbone, read_config

    eager = load_backbone(tiny_bundle, read_config(tiny_bundle), torch.float32, attn_implementation="eager")
    grids = [(1, 4, 6), (1, 6, 4)]
    pixels, g = _pixels(grids, seed=3), torch.tensor(grids)
    with torch.inference_mode():
        want, _ = _tower_output(eager.visual(pixels, grid_thw=g))
        ours, _ = VisionEncoder(eager.visual, "eager")(pixels, g)
        sdpa, _ = VisionEncoder(eager.visual, "sdpa")(pixels, g)
    assert torch.allclose(ours, want, atol=1e-5)  # float32: the interpolation's rounding is far below this
    assert torch.allclose(ours, sdpa, atol=1e-4)
    if compat.SHARES_RELEASE_VISION_NUMERICS:
        assert torch.equal(ours, want)


def test_cache_keyword_is_the_one_this_transformers_takes(backbone):
    lm = backbone.language_model
    params = inspect.signature(type(lm).forward).parameters
    seen = {}

    class Spy(torch.nn.Module):
        def forward(self, **kwargs):
            seen.update(kwargs)
            return kwargs

    Spy.forward.__signature__ = inspect.signature(type(lm).forward)
    compat.lm_forward(Spy(), "CACHE", inputs_embeds=None)
    key = "cache" if "cache" in params else "past_key_values"
    assert seen[key] == "CACHE" and len(seen) == 2


def test_pixel_bounds_resize_as_the_min_max_keywords_did(model):
    import warnings

    import numpy as np
    from PIL import Image

    frames = [Image.fromarray(np.random.default_rng(0).integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in [(360, 640), (97, 1210), (32, 32)]]
    ip = model.processor.image_processor
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 5.x warns on min_pixels / max_pixels; the size spelling is warning-free
        ours = ip(images=frames, return_tensors="pt", **compat.pixel_bounds(1024, 76800))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        old = ip(images=frames, return_tensors="pt", min_pixels=1024, max_pixels=76800)
    assert ours["image_grid_thw"].tolist() == [[1, 12, 22], [1, 4, 60], [1, 2, 2]]
    assert torch.equal(ours["image_grid_thw"], old["image_grid_thw"]) and torch.equal(ours["pixel_values"], old["pixel_values"])
