"""The guard: how far to trust one reward, from what its forward already computed.

A ``Guard`` reads, per candidate, a ``Reading`` (``reading.py``): the reward, the hidden state the head
read, the mean vision feature of each candidate frame, and the frames' own statistics. It turns them
into a handful of numbers, each an answer to "is this like the genuine candidates the guard was fitted
on?":

- three feature densities (a low-rank Gaussian, PPCA-style Mahalanobis distance, fitted on genuine
  candidates): of how the vision features change from frame to frame (``motion``), of their mean over
  the clip (``look``), and of the last hidden state (``last``);
- the frames' sharpness, texture and change, as they are and against the context's;
- the reward itself.

A logistic combination of those (second order: each feature, each times the reward, each squared), learnt on
genuine candidates against candidates hacked by gradient ascent (``fitting.py``), gives ``p``, the probability that
the reward was gamed. The uncertainty is the
part of the reward that ``p`` puts in doubt::

    uncertainty = p * max(0, reward - floor)
    reward - uncertainty = (1 - p) * reward + p * floor

``floor`` is a low genuine reward (the fit's 1st percentile): a gamed reward is worth no more than that.
So the conservative reward is the expected reward under "with probability p this reward means nothing".
Everything is torch on the model's device and differentiable, so an attacker (or a trainer) that ascends
the conservative reward gets its gradient.

The guard lives beside the release's files as ``nvrm_guard.safetensors`` (listed in the bundle's
manifest); its header names the bundle's weights and preprocessing fingerprints, checked on load.

Shapes: B candidates, H hidden, k density components, F features, K frame statistics.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import BundleError
from .reading import Reading
from .stats import STATS

GUARD_FILE = "nvrm_guard.safetensors"
"""The guard's file name in a bundle."""
FORMAT = "nvrm-guard"
VERSION = 1
DENSITIES = ("motion", "look", "last")
"""The feature densities, each over one vector a ``Reading`` holds."""
_LOG_STATS = ("sharpness", "texture", "change")
FEATURES = (
    *(f"{d}_density" for d in DENSITIES),
    *(f"log_{s}" for s in _LOG_STATS),
    "sharpness_over_texture",
    *(f"{s}_vs_context" for s in _LOG_STATS),
    "reward",
)
"""The guard's raw features, in order (the reward last)."""
TERMS = (*FEATURES, *(f"{f}*reward" for f in FEATURES[:-1]), *(f"{f}^2" for f in FEATURES[:-1]))
"""The terms of the logistic combination: each standardised feature, each times the standardised reward (a doubt that
matters only when the reward is high), and each squared (too far either way)."""
_EPS = 1e-4


def expand(z: torch.Tensor) -> torch.Tensor:
    """[B, F] standardised features -> [B, len(TERMS)]: themselves, each times the reward (the last), and each squared."""
    x, reward = z[:, :-1], z[:, -1:]
    return torch.cat([z, x * reward, x * x], 1)


@dataclass
class Density:
    """A Gaussian with a low-rank covariance plus isotropic rest (probabilistic PCA): ``distance`` is its Mahalanobis distance."""

    mean: torch.Tensor  # [H]
    basis: torch.Tensor  # [H, k] orthonormal principal directions
    inv_var: torch.Tensor  # [k] 1 / variance along each
    rest_inv_var: torch.Tensor  # [] 1 / mean variance of the rest

    def distance(self, x: torch.Tensor) -> torch.Tensor:
        """Squared Mahalanobis distance [B] of rows ``x`` [B, H]."""
        z = x.float() - self.mean
        proj = z @ self.basis  # [B, k]
        inside = (proj * proj * self.inv_var).sum(-1)
        rest = ((z * z).sum(-1) - (proj * proj).sum(-1)).clamp_min(0) * self.rest_inv_var
        return inside + rest

    def tensors(self, name: str) -> dict[str, torch.Tensor]:
        return {f"{name}.mean": self.mean, f"{name}.basis": self.basis, f"{name}.inv_var": self.inv_var, f"{name}.rest_inv_var": self.rest_inv_var}

    @classmethod
    def from_tensors(cls, t: dict[str, torch.Tensor], name: str) -> "Density":
        return cls(t[f"{name}.mean"], t[f"{name}.basis"], t[f"{name}.inv_var"], t[f"{name}.rest_inv_var"])

    def to(self, device) -> "Density":
        return Density(*(v.to(device) for v in (self.mean, self.basis, self.inv_var, self.rest_inv_var)))


@dataclass
class Guard:
    """A fitted guard for one bundle (``fit.fit_guard``; ``load_guard`` reads it back)."""

    densities: dict[str, Density]
    center: torch.Tensor  # [F] feature means (standardisation)
    scale: torch.Tensor  # [F] feature standard deviations
    weight: torch.Tensor  # [len(TERMS)] logistic weights on the expanded standardised features
    bias: torch.Tensor  # []
    floor: float
    """What a gamed reward is taken to be worth (a low genuine reward)."""
    threshold: float
    """Uncertainty above which an item counts as doubtful (the monitor's share; the 99th percentile of genuine items)."""
    reference: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    """Genuine range of each monitored statistic and of the reward: (1st percentile, median, 99th percentile)."""
    model: str = ""
    """Fingerprint of the bundle's weights the guard was fitted for (``nvrm.bundle.weights_fingerprint``)."""
    preprocessing: str = ""
    """Fingerprint of the preprocessing (contract, processor, tokenizer, template) it was fitted under."""
    info: dict[str, Any] = field(default_factory=dict)
    """How it was fitted and what it measured (pairs, hacked examples, held-out AUROC ...)."""

    # ------------------------------------------------------------------ evaluation

    def features(self, r: Reading) -> torch.Tensor:
        """The raw features [B, F] (``FEATURES``) of a reading."""
        stats, ctx = r.stats.float(), r.context_stats.float()
        idx = {s: STATS.index(s) for s in _LOG_STATS}
        logs = torch.stack([torch.log(stats[:, idx[s]] + _EPS) for s in _LOG_STATS], 1)
        ctx_logs = torch.stack([torch.log(ctx[:, idx[s]] + _EPS) for s in _LOG_STATS], 1)
        cols = [torch.log1p(self.densities[d].distance(getattr(r, d)) / self.densities[d].mean.shape[0]) for d in DENSITIES]
        return torch.cat(
            [torch.stack(cols, 1), logs, (logs[:, 0] - logs[:, 1]).unsqueeze(1), logs - ctx_logs, r.reward.float().unsqueeze(1)], 1
        )

    def logit(self, r: Reading) -> torch.Tensor:
        """log-odds [B] that each reward was gamed."""
        return expand((self.features(r) - self.center) / self.scale) @ self.weight + self.bias

    def uncertainty(self, r: Reading) -> torch.Tensor:
        """[B] the part of each reward in doubt: ``sigmoid(logit) * max(0, reward - floor)`` (reward units)."""
        return torch.sigmoid(self.logit(r)) * (r.reward.float() - self.floor).clamp_min(0)

    def summary(self) -> dict[str, Any]:
        """What a service's ``/v1/info`` says of it: its numbers, what it was fitted for and its held-out figures."""
        return {"file": GUARD_FILE, "floor": self.floor, "threshold": self.threshold, "model": self.model, "preprocessing": self.preprocessing,
                "method": self.info.get("method"), "holdout": self.info.get("holdout")}

    def to(self, device) -> "Guard":
        """This guard with its tensors on ``device``."""
        import dataclasses

        return dataclasses.replace(
            self, densities={k: d.to(device) for k, d in self.densities.items()},
            center=self.center.to(device), scale=self.scale.to(device), weight=self.weight.to(device), bias=self.bias.to(device),
        )

    @property
    def device(self) -> torch.device:
        return self.center.device

    # ------------------------------------------------------------------ the file

    def save(self, path: str | Path) -> Path:
        """Write the guard as one safetensors file (tensors, and the rest as JSON in its header)."""
        from safetensors.torch import save_file

        tensors = {"center": self.center, "scale": self.scale, "weight": self.weight, "bias": self.bias.reshape(1)}
        for name, d in self.densities.items():
            tensors.update(d.tensors(f"density.{name}"))
        meta = {
            "format": FORMAT, "version": str(VERSION), "features": json.dumps(list(FEATURES)), "densities": json.dumps(list(self.densities)),
            "floor": repr(float(self.floor)), "threshold": repr(float(self.threshold)), "reference": json.dumps(self.reference),
            "model": self.model, "preprocessing": self.preprocessing, "info": json.dumps(self.info, sort_keys=True),
        }
        path = Path(path)
        save_file({k: v.detach().float().cpu().contiguous() for k, v in tensors.items()}, str(path), metadata=meta)
        return path


def load_guard(path: str | Path, *, model: str | None = None, preprocessing: str | None = None, device: Any = "cpu") -> Guard:
    """Read a guard file, refusing a damaged one, one of another format, or one fitted for other weights or
    another preprocessing than the fingerprints given (one line naming both)."""
    from safetensors import safe_open

    path = Path(path)
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # noqa: BLE001 - a damaged file, whatever safetensors says about it
        raise BundleError(f"{path}: not a readable guard file ({' '.join(str(e).split())[:200]}); fit it again with nvrm guard fit") from e
    if meta.get("format") != FORMAT or meta.get("version") != str(VERSION):
        raise BundleError(f"{path}: not an nvrm guard of version {VERSION} (format {meta.get('format')!r}, version {meta.get('version')!r})")
    try:
        names = json.loads(meta["densities"])
        features = json.loads(meta["features"])
        guard = Guard(
            densities={n: Density.from_tensors(tensors, f"density.{n}") for n in names},
            center=tensors["center"], scale=tensors["scale"], weight=tensors["weight"], bias=tensors["bias"].reshape(()),
            floor=float(meta["floor"]), threshold=float(meta["threshold"]),
            reference={k: tuple(v) for k, v in json.loads(meta["reference"]).items()},  # type: ignore[misc]
            model=meta.get("model", ""), preprocessing=meta.get("preprocessing", ""), info=json.loads(meta.get("info", "{}")),
        )
    except (KeyError, ValueError, TypeError) as e:
        raise BundleError(f"{path}: the guard file is damaged ({type(e).__name__}: {e}); fit it again with nvrm guard fit") from e
    if tuple(features) != FEATURES or set(names) != set(DENSITIES) or guard.weight.shape[0] != len(TERMS):
        raise BundleError(f"{path}: the guard's features {features} are not this nvrm's {list(FEATURES)}; fit it again with nvrm guard fit")
    if model is not None and guard.model != model:
        raise BundleError(
            f"{path}: this guard was fitted for other weights (guard {guard.model[:16] or '?'}, bundle {model[:16]}); "
            "fit one for this bundle with nvrm guard fit"
        )
    if preprocessing is not None and guard.preprocessing != preprocessing:
        raise BundleError(
            f"{path}: this guard was fitted under another preprocessing contract (guard {guard.preprocessing[:16] or '?'}, "
            f"bundle {preprocessing[:16]}); fit one for this contract with nvrm guard fit"
        )
    return guard.to(device)
