"""The guard's pure parts: frame statistics on patches, densities, the combination, its file, the conservative check, the monitor."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from nvrm.errors import BundleError, ConfigError
from nvrm.guard.combine import build_guard, fit_density, logistic
from nvrm.guard.conservative import check_conservative, conservative_reward
from nvrm.guard.separation import auroc, pairwise_accuracy
from nvrm.guard.monitor import Monitor, MonitorSettings
from nvrm.guard.reading import Reading, motion_of
from nvrm.guard.stats import STATS, frame_stats
from nvrm.guard.trust import FEATURES, load_guard

PS = 16


def patches_of(frames: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 (T, H, W, 3) frames -> (patches [N, 3*16*16], grids [T, 3]) in the codec's layout."""
    from nvrm.engine.codec import PixelCodec

    codec = PixelCodec(PS, 2, 2, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0))
    parts = [codec.patchify(f) for f in frames]
    grids = [codec.grid(f.shape[0], f.shape[1]) for f in frames]
    return torch.from_numpy(np.concatenate(parts)), torch.tensor(grids)


def stat(frames: np.ndarray, name: str) -> float:
    p, g = patches_of(frames)
    return float(frame_stats(p, g, PS)[STATS.index(name)])


def test_frame_statistics_of_plain_noisy_and_changing_frames():
    flat = np.full((3, 64, 64, 3), 128, np.uint8)
    assert stat(flat, "brightness") == pytest.approx(128 / 255, abs=1e-6)
    for name in ("contrast", "sharpness", "texture", "change", "saturation"):
        assert stat(flat, name) == pytest.approx(0.0, abs=1e-5), name
    rng = np.random.default_rng(0)
    noisy = np.clip(flat.astype(int) + rng.integers(-20, 21, flat.shape), 0, 255).astype(np.uint8)
    assert stat(noisy, "texture") > 0.05 and stat(noisy, "sharpness") > 0.05 and stat(noisy, "change") > 0.01
    red = flat.copy()
    red[..., 0] = 255
    assert stat(red, "saturation") > 0.4
    moving = flat.copy()
    moving[1, 16:32, 16:32] = 255
    assert stat(moving, "change") > 0 and stat(flat, "change") == 0
    # the luma mean is the plain mean of the frames, whatever the patch layout
    img = rng.integers(0, 256, (2, 64, 96, 3), dtype=np.uint8)
    luma = (0.299 * img[..., 0] + 0.587 * img[..., 1] + 0.114 * img[..., 2]) / 255
    assert stat(img, "brightness") == pytest.approx(float(luma.mean()), rel=1e-5)


def test_frame_statistics_carry_a_gradient_and_an_empty_clip_is_zeros():
    p, g = patches_of(np.full((2, 32, 32, 3), 90, np.uint8))
    x = p.float().requires_grad_(True)
    frame_stats(x, g, PS).sum().backward()
    assert x.grad is not None and bool(torch.isfinite(x.grad).all())
    assert torch.equal(frame_stats(p[:0], g[:0], PS), torch.zeros(len(STATS)))


def test_motion_of_one_frame_is_zero_and_of_a_changing_one_is_its_mean_change():
    assert torch.equal(motion_of(torch.ones(1, 4)), torch.zeros(4))
    f = torch.tensor([[0.0, 0.0], [1.0, -2.0], [1.0, 0.0]])
    assert torch.allclose(motion_of(f), torch.tensor([0.5, 2.0]))


def test_a_density_puts_outliers_far_and_its_own_data_near():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(400, 16, generator=g) * torch.linspace(0.1, 3, 16)
    full, low = fit_density(x, components=16), fit_density(x, components=8)
    for d in (full, low):
        inside = float(d.distance(x).mean())
        assert 8 < inside < 32  # about the dimension, for the data it was fitted on
        assert float(d.distance(torch.full((1, 16), 10.0))[0]) > 10 * inside
    outlier = torch.zeros(1, 16)
    outlier[0, 0] = 3.0  # 30 standard deviations along the narrowest direction
    assert float(full.distance(outlier)[0]) > 500  # kept directions are measured on their own scale
    assert float(low.distance(outlier)[0]) > 5  # the rest, on its average one


def test_logistic_regression_separates_and_weights_classes_equally():
    g = torch.Generator().manual_seed(1)
    x = torch.cat([torch.randn(200, 2, generator=g), torch.randn(20, 2, generator=g) + torch.tensor([3.0, 0.0])])
    y = torch.cat([torch.zeros(200), torch.ones(20)])
    w, b = logistic(x, y, l2=0.1)
    p = torch.sigmoid(x @ w + b)
    assert float(w[0]) > 1.0 and abs(float(w[1])) < 0.5
    assert auroc(p[200:].tolist(), p[:200].tolist()) > 0.95
    assert 0.3 < float(p[200:].mean()) and float(p[:200].mean()) < 0.3


def test_auroc_and_pairwise_accuracy_count_ties_half():
    assert auroc([3, 4], [1, 2]) == 1.0
    assert auroc([1], [1]) == 0.5
    assert auroc([0, 2], [1]) == 0.5
    assert pairwise_accuracy([1, 2, 3], [0, 2, 4]) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        auroc([], [1])


def readings(n: int, hacked: bool, seed: int) -> Reading:
    """Synthetic readings: genuine ones from one distribution; hacked ones with a larger frame-to-frame feature change and a higher reward."""
    g = torch.Generator().manual_seed(seed)
    h = 8
    motion = torch.rand(n, h, generator=g) * (4.0 if hacked else 1.0)
    stats = torch.rand(n, len(STATS), generator=g) * 0.2 + 0.1
    return Reading(
        reward=torch.randn(n, generator=g) + (6.0 if hacked else 0.0),
        last=torch.randn(n, h, generator=g), motion=motion, look=torch.randn(n, h, generator=g), stats=stats,
        context_stats=torch.rand(n, len(STATS), generator=g) * 0.2 + 0.1,
    )


@pytest.fixture(scope="module")
def fitted():
    return build_guard(readings(200, False, 0), readings(80, True, 1), seed=0, model="m" * 64, preprocessing="p" * 64)


def test_a_fitted_guard_separates_held_out_readings_and_its_conservative_reward_falls_to_the_floor(fitted):
    genuine, hacked = readings(100, False, 2), readings(40, True, 3)
    ug, uh = fitted.uncertainty(genuine), fitted.uncertainty(hacked)
    assert auroc(uh.tolist(), ug.tolist()) > 0.95
    assert bool((ug >= 0).all()) and float(fitted.threshold) >= 0
    conservative = hacked.reward - uh
    assert float(conservative.max()) < float(hacked.reward.min())  # every hacked reward pulled down
    p = torch.sigmoid(fitted.logit(hacked))
    assert torch.allclose(conservative, (1 - p) * hacked.reward + p * fitted.floor, atol=1e-4)
    assert fitted.features(genuine).shape == (100, len(FEATURES))
    for name in ("brightness", "saturation", "contrast", "sharpness", "change", "reward"):
        lo, mid, hi = fitted.reference[name]
        assert lo <= mid <= hi


def test_the_guard_file_round_trips_and_refuses_others(fitted, tmp_path):
    path = fitted.save(tmp_path / "g.safetensors")
    back = load_guard(path, model="m" * 64, preprocessing="p" * 64)
    r = readings(10, True, 4)
    assert torch.equal(back.uncertainty(r), fitted.uncertainty(r))
    assert back.floor == fitted.floor and back.reference == fitted.reference
    with pytest.raises(BundleError, match=r"other weights \(guard mmmm.*bundle xxxx"):
        load_guard(path, model="x" * 64)
    with pytest.raises(BundleError, match=r"another preprocessing contract \(guard pppp.*bundle qqqq"):
        load_guard(path, preprocessing="q" * 64)
    damaged = tmp_path / "bad.safetensors"
    damaged.write_bytes(path.read_bytes()[:100])
    with pytest.raises(BundleError, match="not a readable guard file") as e:
        load_guard(damaged)
    assert "\n" not in str(e.value)


def test_conservative_needs_a_number_and_a_guard():
    assert check_conservative(None, None) is None
    assert check_conservative(2, object()) == 2.0
    assert check_conservative("0.5", object()) == 0.5
    with pytest.raises(ConfigError, match="conservative=1: this model has no guard.*nvrm guard fit"):
        check_conservative(1, None)
    for bad in (-1, math.nan, "lots", True):
        with pytest.raises(ConfigError, match="must be"):
            check_conservative(bad, object())
    assert conservative_reward(3.0, 0.5, 2.0) == 2.0
    with pytest.raises(ConfigError, match="without an uncertainty"):
        conservative_reward(3.0, None, 1.0)


REFERENCE = {"brightness": (0.2, 0.4, 0.6), "saturation": (0.1, 0.3, 0.5), "contrast": (0.05, 0.1, 0.2), "sharpness": (0.01, 0.05, 0.1),
             "change": (0.0, 0.02, 0.08), "reward": (-10.0, 0.0, 10.0)}
GENUINE_STATS = {"brightness": 0.4, "saturation": 0.3, "contrast": 0.1, "sharpness": 0.05, "change": 0.02}


def test_the_monitor_stays_ok_on_genuine_items_and_warms_up_first():
    m = Monitor(REFERENCE, threshold=1.0, settings=MonitorSettings(window=64, min_items=16))
    m.add(1.0, 0.1, GENUINE_STATS)
    assert m.snapshot()["state"] == "ok" and "1 of the 16" in m.snapshot()["reason"]
    rng = np.random.default_rng(0)
    for _ in range(100):
        m.add(float(rng.normal()), float(rng.uniform(0, 0.5)), GENUINE_STATS)
    snap = m.snapshot()
    assert snap["state"] == "ok", snap["reason"]
    assert snap["items"] == 64 and snap["total"] == 101 and snap["uncertainty"]["share_above"] == 0.0


def test_the_monitor_is_suspect_when_items_are_doubtful_or_reward_rises_while_frames_drift():
    m = Monitor(REFERENCE, threshold=1.0, settings=MonitorSettings(window=64, min_items=16))
    for _ in range(40):
        m.add(8.0, 5.0, GENUINE_STATS)
    snap = m.snapshot()
    assert snap["state"] == "suspect" and "doubtful" in snap["reason"] and "\n" not in snap["reason"]
    drift = Monitor(REFERENCE, threshold=1.0, settings=MonitorSettings(window=64, min_items=16))
    for k in range(64):
        bright = 0.4 if k < 32 else 0.95
        drift.add(float(k) / 4, 0.1, {**GENUINE_STATS, "brightness": bright})
    snap = drift.snapshot()
    assert snap["state"] == "suspect" and "brightness" in snap["reason"] and "rising" in snap["reason"], snap["reason"]
    flat = Monitor(REFERENCE, threshold=1.0, settings=MonitorSettings(window=64, min_items=16))
    for _ in range(64):
        flat.add(0.0, 0.1, {**GENUINE_STATS, "brightness": 0.95})
    assert flat.snapshot()["state"] == "ok" and "not rising" in flat.snapshot()["reason"]


def test_the_monitor_without_a_guard_reports_rewards_only_and_takes_probe_results():
    m = Monitor.for_guard(None, MonitorSettings(window=32, min_items=4))
    for r in (1.0, 2.0, math.nan, 3.0, 4.0):
        m.add(r)
    snap = m.snapshot()
    assert snap["items"] == 4 and snap["reward"]["mean"] == 2.5 and snap["state"] == "ok" and "no guard" in snap["reason"]
    p = Monitor(REFERENCE, threshold=1.0, settings=MonitorSettings(window=32, min_items=4))
    for _ in range(8):
        p.add(1.0, 0.1, GENUINE_STATS)
        p.add_probe(True)
    assert p.snapshot()["state"] == "suspect" and "perturbations" in p.snapshot()["reason"]
    with pytest.raises(ConfigError):
        MonitorSettings(window=4, min_items=8)


def test_the_monitor_counts_what_the_members_checked_and_draws_their_share_of_calls():
    from nvrm.guard.monitor import sampled
    from nvrm.settings import LoadSettings

    m = Monitor(REFERENCE, threshold=1.0, settings=MonitorSettings(window=64, min_items=16))
    for _ in range(40):  # the guard finds nothing doubtful...
        m.add(1.0, 0.1, GENUINE_STATS)
    m.add_members([0.5] * 10)
    assert m.snapshot()["members"] == {"checked": 10, "share_above": 0.0} and m.snapshot()["state"] == "ok"
    m.add_members([3.0] * 10 + [math.nan])  # ...the members doubt half of what they checked (a NaN is no reading)
    snap = m.snapshot()
    assert snap["members"] == {"checked": 20, "share_above": 0.5}
    assert snap["state"] == "suspect" and "members checked" in snap["reason"] and "\n" not in snap["reason"], snap["reason"]
    few = Monitor(REFERENCE, threshold=1.0, settings=MonitorSettings(window=64, min_items=16))
    few.add_members([3.0] * 4)  # too few checked to call it
    assert few.snapshot()["state"] == "ok"
    assert Monitor.for_guard(None).snapshot()["members"] == {"checked": 0, "share_above": None}
    # the draw: seeded per call, so a share of the calls, the same ones every run
    draws = [m.draw(0.25) for _ in range(400)]
    assert draws == [sampled(0.25, f"members|{n}") for n in range(1, 401)] and 60 < sum(draws) < 140
    assert not any(Monitor(REFERENCE, 1.0).draw(0.0) for _ in range(50)) and all(Monitor(REFERENCE, 1.0).draw(1.0) for _ in range(50))
    for bad, why in [({"member_rate": 1.5}, "share in"), ({"member_rate": -0.1}, "share in"), ({"member_rate": True}, "share in"),
                     ({"members": True, "member_rate": 0.5}, "already run on every item")]:
        with pytest.raises(ConfigError, match=why):
            LoadSettings(**bad)


def test_the_squeeze_keeps_what_frames_show_and_loses_a_pixel_pattern():
    import numpy as np

    from nvrm.bench.hacking import squeeze

    flat = np.full((2, 32, 48, 3), 120, np.uint8)
    assert squeeze(flat).shape == flat.shape and np.abs(squeeze(flat).astype(int) - 120).max() <= 2
    pattern = flat.copy()
    pattern[:, ::2, ::2] += 8  # an 8-level high-frequency perturbation, as a pixel-space hack leaves
    assert np.abs(squeeze(pattern).astype(int) - pattern).mean() > 1.5
