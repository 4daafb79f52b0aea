"""Wan2.1-VAE latents -> uint8 video frames, for world-model trainers that send latents (cosmos-rl).

cosmos-rl's trainers send each rollout as the latents its Wan2.1 VAE encoder wrote, normalised
per channel: ``z_norm = (z - mean) / std`` with Wan2.1's 16 means and standard deviations (the
values diffusers' ``AutoencoderKLWan`` config holds as ``latents_mean`` / ``latents_std``; the
legacy path also multiplies by ``sigma_data``, 1 by default). Decoding undoes that,
``z = z_norm * std + mean``, runs diffusers' decoder (clamped to [-1, 1]) and maps pixels to
levels the way nvrm maps every float frame: ``round((x + 1) / 2 * 255)``.

    [B, 16, T_lat, h, w] float16/32 latents  ->  [B, 1 + 4 (T_lat - 1), 8h, 8w, 3] uint8 frames

The decoder is a local folder (diffusers ``save_pretrained`` layout, safetensors) or a single
``Wan2.1_VAE.pth`` file through ``from_single_file``. It runs on the reward model's device, in
bfloat16 on a GPU and float32 on the CPU, one request's samples in one batch. Needs the
``nvrm[cosmos]`` extra (diffusers).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from ..errors import ConfigError

CHANNELS = 16
"""Wan2.1 latent channels."""
TEMPORAL, SPATIAL = 4, 8
"""Wan2.1's compression: 4 frames per latent frame (after the first), 8 pixels per latent pixel."""


def frames_of(t_lat: int) -> int:
    """Pixel frames decoded from ``t_lat`` latent frames (93 from 24)."""
    return 1 + TEMPORAL * (t_lat - 1)


def decoded_bytes(shape: tuple[int, ...]) -> int:
    """Memory decoding latents of ``shape`` [B, 16, T, h, w] holds at its peak: the decoder's float32
    output and the uint8 frames made from it."""
    b, _, t, h, w = shape
    pixels = b * frames_of(t) * (SPATIAL * h) * (SPATIAL * w) * 3
    return pixels * (4 + 1)


class LatentDecoder:
    """A Wan2.1 VAE decoder, loaded once."""

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
        if int(cfg.z_dim) != CHANNELS or len(cfg.latents_mean) != CHANNELS:
            raise ConfigError(f"--latent-decoder {path}: a VAE of {cfg.z_dim} latent channels; cosmos-rl's Wan2.1 latents have {CHANNELS}")
        self.mean = torch.tensor(cfg.latents_mean, dtype=torch.float32).view(1, CHANNELS, 1, 1, 1)
        self.std = torch.tensor(cfg.latents_std, dtype=torch.float32).view(1, CHANNELS, 1, 1, 1)
        self.path = str(path)

    @torch.inference_mode()
    def decode(self, latents: np.ndarray, sigma_data: float = 1.0) -> tuple[np.ndarray, float]:
        """(uint8 frames [B, T, H, W, 3], seconds the decode took) of normalised latents [B, 16, T_lat, h, w]."""
        t = time.perf_counter()
        z = torch.from_numpy(np.array(latents, dtype=np.float32)) / sigma_data  # a copy: the body's bytes are read-only
        z = (z * self.std + self.mean).to(self.device, self.dtype)
        x = self.vae.decode(z).sample  # [B, 3, T, H, W] in [-1, 1]
        levels = ((x.float() + 1.0) / 2.0 * 255.0).round().clamp(0, 255).to(torch.uint8)
        frames = levels.permute(0, 2, 3, 4, 1).contiguous().cpu().numpy()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return frames, time.perf_counter() - t
