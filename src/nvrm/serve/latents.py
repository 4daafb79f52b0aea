"""Wan2.1-VAE latents -> uint8 video frames, for world-model trainers that send latents (cosmos-rl).

cosmos-rl's trainers send each rollout as the latents its Wan2.1 VAE encoder wrote, normalised
per channel: ``z_norm = (z - mean) / std`` with Wan2.1's 16 means and standard deviations (the
values diffusers' ``AutoencoderKLWan`` config holds as ``latents_mean`` / ``latents_std``; the
legacy path also multiplies by ``sigma_data``, 1 by default). Decoding undoes that,
``z = z_norm * std + mean``, runs diffusers' decoder (clamped to [-1, 1]) and maps pixels to
levels the way nvrm maps every float frame: ``round((x + 1) / 2 * 255)``.

    [B, 16, T_lat, h, w] float16/32 latents  ->  [B, 1 + 4 (T_lat - 1), 8h, 8w, 3] uint8 frames
    [B, 48, T_lat, h, w] (Wan2.2 / Cosmos VAE) ->  [B, 1 + 4 (T_lat - 1), 16h, 16w, 3], with a 48-channel decoder

The decoder is a local folder (diffusers ``save_pretrained`` layout, safetensors) or a single
``Wan2.1_VAE.pth`` file through ``from_single_file``. It runs on the reward model's device, in
bfloat16 on a GPU and float32 on the CPU, one request's samples in one batch (rollouts of separate requests are
not batched together: on the CPU a batch of 8 does not decode to the same frames, bit for bit, as 8 decodes of 1). Needs the
``nvrm[cosmos]`` extra (diffusers).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import torch

from ..errors import ConfigError, InputError

CHANNELS = 16
"""Wan2.1 latent channels."""
TEMPORAL, SPATIAL = 4, 8
"""Wan2.1's compression: 4 frames per latent frame (after the first), 8 pixels per latent pixel."""
SPATIAL_OF = {16: 8, 48: 16}
"""Pixels per latent pixel, by latent channels: Wan2.1's VAE (16 channels, 8x) and Wan2.2's / Cosmos' (48 channels, 16x,
diffusers ``AutoencoderKLWan`` with ``z_dim=48, patch_size=2, scale_factor_spatial=16``); both 4 frames per latent frame."""


def frames_of(t_lat: int) -> int:
    """Pixel frames decoded from ``t_lat`` latent frames (93 from 24)."""
    return 1 + TEMPORAL * (t_lat - 1)


def decoded_bytes(shape: tuple[int, ...], spatial: int = SPATIAL) -> int:
    """Memory of the decoder's float32 output and the uint8 frames made from it, for latents of ``shape``
    [B, 16, T, h, w]: a floor under ``decode_peak_bytes`` (what a decode reserves), without the activations."""
    b, _, t, h, w = shape
    pixels = b * frames_of(t) * (spatial * h) * (spatial * w) * 3
    return pixels * (4 + 1)


# Host memory of one CPU decode (float32), measured with benchmarks/decoder_peak.py (peak RSS above the
# resident size before it; docs/limits.md has the table) and fitted per output pixel of one chunk:
# diffusers decodes latent frame by latent frame, the first into 1 pixel frame, each later one into 4,
# so the activations peak at the first 4-frame chunk and do not grow with T_lat.
PIXEL_BYTES = (1500, 55)
"""Activation bytes per output pixel of a 1-frame chunk: ``a + b * base_dim``, 12% over the fit of (tiny VAE, base_dim 8:
1.72 KB measured; Wan2.1, base_dim 96: 6.06 KB)."""
CHUNK4 = 5.0
"""A 4-frame chunk's activations over a 1-frame chunk's (4.25 measured on the tiny VAE; 5 for margin)."""
FIXED_OF_WEIGHTS = 0.3
"""Shape-independent working memory, as a fraction of the weights' bytes (130 MB of Wan2.1's 508 MB measured)."""
OUTPUT_BYTES = 8 + 2
"""Per decoded value: diffusers' float32 output twice (its frame-by-frame ``torch.cat``, then the clamp's
copy), and the uint8 frames twice (levels, then the channels-last copy)."""


def decode_peak_bytes(shape: tuple[int, ...], base_dim: int, weight_bytes: int, on_host: bool = True, spatial: int = SPATIAL) -> int:
    """Host memory decoding latents of ``shape`` [B, 16, T, h, w] takes at its peak, for a Wan VAE of
    ``base_dim`` with ``weight_bytes`` of weights. ``on_host=False`` (a GPU decode): the activations are
    device memory, and only the uint8 frames and a float copy of them come back to the host."""
    b, _, t, h, w = shape
    pixels = (spatial * h) * (spatial * w)
    values = b * frames_of(t) * pixels * 3
    if not on_host:
        return values * (4 + 2)
    chunk = b * pixels * (PIXEL_BYTES[0] + PIXEL_BYTES[1] * base_dim) * (CHUNK4 if t > 1 else 1.0)
    return int(chunk + FIXED_OF_WEIGHTS * weight_bytes) + values * OUTPUT_BYTES


class LatentDecoder:
    """A Wan VAE decoder, loaded once: Wan2.1's (16 latent channels) or Wan2.2's / Cosmos' (48)."""

    def __init__(self, path: str | Path, device: torch.device | str = "cpu"):
        try:
            from diffusers import AutoencoderKLWan
        except ImportError as e:
            raise ConfigError("--latent-decoder needs diffusers: pip install 'nvrm[cosmos]'") from e
        p = Path(path)
        self.device = torch.device(device)
        self.dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        if p.is_dir():
            vae = AutoencoderKLWan.from_pretrained(str(p), use_safetensors=True, torch_dtype=self.dtype)
        elif p.is_file() and p.suffix in (".pth", ".pt", ".safetensors"):
            vae = AutoencoderKLWan.from_single_file(str(p), torch_dtype=self.dtype)  # the Wan2.1_VAE.pth cosmos-rl loads
        else:
            raise ConfigError(f"--latent-decoder {path}: not a diffusers AutoencoderKLWan folder or a Wan2.1_VAE .pth/.safetensors file")
        self.vae = vae.to(self.device).eval()
        self.vae.requires_grad_(False)
        cfg = self.vae.config
        self.channels = int(cfg.z_dim)
        if self.channels not in SPATIAL_OF or len(cfg.latents_mean) != self.channels:
            raise ConfigError(f"--latent-decoder {path}: a VAE of {cfg.z_dim} latent channels; cosmos-rl's latents have 16 (Wan2.1) "
                              "or 48 (Wan2.2, Cosmos)")
        self.spatial = int(getattr(cfg, "scale_factor_spatial", None) or SPATIAL_OF[self.channels])
        if self.spatial != SPATIAL_OF[self.channels]:
            raise ConfigError(f"--latent-decoder {path}: {self.channels} latent channels at {self.spatial}x; "
                              f"Wan VAEs of {self.channels} channels decode at {SPATIAL_OF[self.channels]}x")
        self.mean = torch.tensor(cfg.latents_mean, dtype=torch.float32).view(1, self.channels, 1, 1, 1)
        self.std = torch.tensor(cfg.latents_std, dtype=torch.float32).view(1, self.channels, 1, 1, 1)
        self.path = str(path)
        self.base_dim = int(cfg.base_dim)
        self.weight_bytes = sum(p.numel() * p.element_size() for p in self.vae.parameters())
        self._vae_lock = threading.Lock()
        """One VAE call at a time (it fills the device, or every core); a rollout's normalisation and its frames'
        conversion run outside it, beside another's VAE call."""

    def peak_bytes(self, shape: tuple[int, ...]) -> int:
        """Host memory decoding latents of ``shape`` takes at its peak with this VAE (``decode_peak_bytes``)."""
        return decode_peak_bytes(tuple(shape), self.base_dim, self.weight_bytes, self.device.type == "cpu", self.spatial)

    @torch.inference_mode()
    def decode(self, latents: np.ndarray, sigma_data: float = 1.0, refused: dict[int, str] | None = None) -> tuple[np.ndarray, float]:
        """(uint8 frames [B, T, H, W, 3], seconds the decode took) of normalised latents [B, 16, T_lat, h, w].

        A rollout whose latents or decoded pixels are not finite (NaN, an overflow inside the VAE) would
        decode to a black video: it is named in ``refused`` (index -> reason; its frames are zeros and are
        not to be scored), and the others keep theirs. Without ``refused`` such a rollout is an ``InputError``.
        Rollouts already in ``refused`` are decoded from zeros, so they cannot touch the others."""
        t = time.perf_counter()
        given = {} if refused is None else refused
        z = torch.from_numpy(np.array(latents, dtype=np.float32)) / sigma_data  # a copy: the body's bytes are read-only
        z = z * self.std + self.mean
        self._drop(z, given, "its latents are not finite once divided by sigma_data")
        waited = time.perf_counter()
        with self._vae_lock:  # the seconds returned leave out this wait for another rollout's VAE call
            waited = time.perf_counter() - waited
            x = self.vae.decode(z.to(self.device, self.dtype)).sample  # [B, 3, T, H, W] in [-1, 1]
        del z
        self._drop(x, given, "its decoded frames are not finite (the VAE overflowed)")
        x = x.float()  # in place from here on: no float copy of the whole video beside it
        levels = x.add_(1.0).mul_(127.5).round_().clamp_(0, 255).to(torch.uint8)
        del x
        frames = levels.permute(0, 2, 3, 4, 1).contiguous().cpu().numpy()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        if refused is None and given:
            raise InputError("latents", "; ".join(given[i] for i in sorted(given)))
        return frames, time.perf_counter() - t - waited

    @staticmethod
    def _drop(x: torch.Tensor, refused: dict[int, str], why: str) -> None:
        """Zero (in place) the rollouts of ``x`` [B, ...] that are refused or not finite, naming the new ones in ``refused``."""
        for i in range(x.shape[0]):
            if i not in refused and not bool(torch.isfinite(x[i]).all()):
                refused[i] = f"rollout {i}: {why}; it is not scored"
            if i in refused:
                x[i].zero_()
