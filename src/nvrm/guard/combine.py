"""Fitting a guard's numbers from readings of genuine and hacked candidates (pure numerics, no model, no I/O).

``build_guard(genuine, hacked)``:

1. the feature densities are fitted on genuine readings, **cross-fitted**: the features a genuine
   candidate gets for the combination come from densities that never saw it (two folds), so the
   combination learns how far a *new* genuine candidate lies, not how close a seen one does;
2. a logistic regression (L2, classes weighted equally) on the standardised features, second order
   (``trust.TERMS``: each feature, each times the reward, each squared), separates the hacked from the genuine;
3. the final densities are refitted on every genuine reading; ``floor`` is the genuine rewards' 1st
   percentile, ``threshold`` the genuine uncertainties' 99th, and the monitor's reference ranges come
   from the genuine readings.

Shapes: n readings, H hidden, k components, F features.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from .trust import DENSITIES, Density, Guard, expand
from .reading import Reading
from .stats import MONITORED, STATS

COMPONENTS = 64
"""Principal directions a density keeps (the rest is one isotropic variance)."""


def fit_density(x: torch.Tensor, components: int = COMPONENTS) -> Density:
    """A probabilistic-PCA Gaussian of rows ``x`` [n, H] (float64 arithmetic, float32 result)."""
    x = x.detach().double().cpu()
    n, h = x.shape
    mean = x.mean(0)
    z = x - mean
    _, s, vh = torch.linalg.svd(z, full_matrices=False)
    var = s * s / max(1, n - 1)  # eigenvalues, descending
    total = float(var.sum()) / h + 1e-12
    k = max(1, min(components, n - 1, h))
    kept = var[:k]
    rest = float(var[k:].sum()) / max(1, h - k) if h > k else 0.0
    floor = 1e-3 * total  # no direction is trusted below a thousandth of the average variance
    inv = 1.0 / (kept + floor)
    rest_inv = 1.0 / (max(rest, 0.0) + floor)
    return Density(mean.float(), vh[:k].T.contiguous().float(), inv.float(), torch.tensor(rest_inv, dtype=torch.float32))


def fit_densities(genuine: Reading, components: int = COMPONENTS) -> dict[str, Density]:
    return {d: fit_density(getattr(genuine, d), components) for d in DENSITIES}


def logistic(x: torch.Tensor, y: torch.Tensor, l2: float = 1.0, steps: int = 50) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [F], bias) of an L2-regularised logistic regression with both classes weighted equally (Newton's method)."""
    x, y = x.double(), y.double()
    n, f = x.shape
    pos = float(y.sum())
    w_row = torch.where(y > 0, 0.5 * n / max(pos, 1.0), 0.5 * n / max(n - pos, 1.0))
    a = torch.cat([x, torch.ones(n, 1, dtype=x.dtype)], 1)
    theta = torch.zeros(f + 1, dtype=x.dtype)
    reg = torch.full((f + 1,), l2, dtype=x.dtype)
    reg[-1] = 0.0
    for _ in range(steps):
        p = torch.sigmoid(a @ theta)
        grad = a.T @ (w_row * (p - y)) + reg * theta
        hess = (a * (w_row * p * (1 - p)).unsqueeze(1)).T @ a + torch.diag(reg) + 1e-9 * torch.eye(f + 1, dtype=x.dtype)
        step = torch.linalg.solve(hess, grad)
        theta = theta - step
        if float(step.abs().max()) < 1e-8:
            break
    return theta[:-1].float(), theta[-1].float()


def _quantiles(v: torch.Tensor) -> tuple[float, float, float]:
    q = torch.quantile(v.double().cpu(), torch.tensor([0.01, 0.5, 0.99], dtype=torch.float64))
    return (float(q[0]), float(q[1]), float(q[2]))


def two_folds(n: int, groups: Sequence[str] | None, seed: int) -> list[list[int]]:
    """Rows 0..n-1 in two folds, whole groups together (an example's candidates share its context: a fold that saw one of
    them would find the others familiar); seeded (pure)."""
    if groups is None:
        groups = [str(i) for i in range(n)]
    names = sorted(set(groups))
    order = torch.randperm(len(names), generator=torch.Generator().manual_seed(seed)).tolist()
    first = {names[i] for i in order[: (len(names) + 1) // 2]}
    return [[i for i in range(n) if groups[i] in first], [i for i in range(n) if groups[i] not in first]]


def build_guard(genuine: Reading, hacked: Reading, *, seed: int = 0, l2: float = 3.0, components: int = COMPONENTS,
                model: str = "", preprocessing: str = "", info: dict | None = None,
                genuine_groups: Sequence[str] | None = None, hacked_groups: Sequence[str] | None = None) -> Guard:
    """A guard from readings of genuine and hacked candidates (module docstring); ``*_groups``: each row's example (its
    prompt and context), so the cross-fit keeps an example's candidates in one fold."""
    genuine, hacked = genuine.detach(), hacked.detach()
    folds = two_folds(len(genuine), genuine_groups, seed)
    if hacked_groups is not None and genuine_groups is not None:
        first = {genuine_groups[i] for i in folds[0]}
        h_folds = [[i for i, g in enumerate(hacked_groups) if g in first], [i for i, g in enumerate(hacked_groups) if g not in first]]
    else:
        h_folds = two_folds(len(hacked), None, seed + 1)
    probe = Guard(densities={}, center=torch.zeros(1), scale=torch.ones(1), weight=torch.zeros(1), bias=torch.zeros(()), floor=0.0, threshold=0.0)
    feats = []
    for f in range(2):
        probe.densities = fit_densities(genuine.select(folds[1 - f]), components)  # densities that never saw fold f
        feats.append((probe.features(genuine.select(folds[f])), probe.features(hacked.select(h_folds[f]))))
    feats_g = torch.cat([g for g, _ in feats])
    feats_h = torch.cat([h for _, h in feats])
    x = torch.cat([feats_g, feats_h])
    center, scale = x.mean(0), x.std(0).clamp_min(1e-6)
    y = torch.cat([torch.zeros(len(feats_g)), torch.ones(len(feats_h))])
    weight, bias = logistic(expand((x - center) / scale), y, l2=l2)
    rewards_g = genuine.reward.cpu()
    floor = float(torch.quantile(rewards_g.double(), 0.01))
    logit_g = expand((feats_g - center) / scale) @ weight + bias
    reward_g = torch.cat([genuine.select(folds[f]).reward for f in range(2)]).cpu()
    u_g = torch.sigmoid(logit_g) * (reward_g - floor).clamp_min(0)
    threshold = float(torch.quantile(u_g.double(), 0.99))
    reference = {s: _quantiles(genuine.stats[:, STATS.index(s)]) for s in MONITORED}
    reference["reward"] = _quantiles(rewards_g)
    guard = Guard(fit_densities(genuine, components), center, scale, weight, bias, floor, threshold, reference, model, preprocessing, dict(info or {}))
    if not all(math.isfinite(float(v)) for v in torch.cat([weight, bias.reshape(1), center, scale])):  # pragma: no cover - degenerate data
        from ..errors import ConfigError

        raise ConfigError("the guard's fit did not converge (non-finite weights); give more, and more varied, preference pairs")
    return guard
