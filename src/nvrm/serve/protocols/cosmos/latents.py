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
bfloat16 on a GPU and float32 on the CPU. Needs the ``nvrm[cosmos]`` extra (diffusers).

A rollout decodes to the same frames, bit for bit, whatever else is in its batch, so the service may batch the
rollouts of separate requests (``DecodeQueue``: a group's B = 1 rollouts in one VAE call) and its rewards still equal
what ``LatentDecoder.decode`` gives in process, one rollout or a whole group at a time. On the CPU that takes one
rule: the VAE never sees fewer than ``MIN_CPU_ROWS`` rows (a lone rollout is decoded beside a row of zeros, which
is dropped). PyTorch runs a small 3D convolution of one row on its own im2col kernel and of two or more on oneDNN's,
and the two kernels round differently; oneDNN's rows do not depend on the batch (checked for batches of 1 to 8 on the
tiny VAE, ``tests/integration/test_latent_batching.py``). And a CPU VAE call runs on one intra-op thread
(``CPU_THREADS``), so the frames do not depend on the machine's core count either; the service decodes several batches
at once in worker processes instead (nvrm.serve.protocols.cosmos.decode_workers). On a GPU (cuDNN, bfloat16) batch invariance was not
measured; the rule there is the same code path, one VAE call per batch.
"""

from __future__ import annotations

import contextlib
import queue
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ....errors import ConfigError, InputError

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
MIN_CPU_ROWS = 2
"""The fewest rows the VAE sees on the CPU (padded with zero rows): PyTorch takes oneDNN's convolution for every layer
from two rows up, and its rows are the same whatever the batch; a single row would take the im2col kernel, which rounds
differently (frames a few 1e-6 apart before levels, so a level or two off here and there)."""
MAX_BATCH_ROWS = 16
"""The most rollouts ``DecodeQueue`` puts in one VAE call."""
GATHER_S = 0.03
"""How long ``DecodeQueue`` waits for another rollout of the same shape once one is queued (a group's B = 1
enqueues arrive within milliseconds of each other); the wait ends early at ``MAX_BATCH_ROWS`` rows."""
GATHER_MAX_S = 0.25
"""The longest the first rollout of a batch waits while more keep coming."""
CPU_THREADS = 1
"""Intra-op threads of a CPU VAE call. The frames depend on it (1 and 2 threads put a value a level apart here and there,
about 1 in 10,000 on the tiny VAE), and a second thread does not make the decode faster (thousands of small operations:
6.9 s and 7.0 s for 8 rollouts on 2 cores), while two calls side by side take the time of one. So every CPU decode runs
on one thread, whatever the machine's core count, and the service gets its speed from several calls at once
(nvrm.serve.protocols.cosmos.decode_workers)."""
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


@contextlib.contextmanager
def _cpu_threads(device: torch.device, n: int):
    """torch's intra-op threads set to ``n`` for a CPU call, then restored (a setting of the whole process: a CPU decode
    in a process that also scores on other threads slows their operations meanwhile; the service decodes in worker
    processes of its own)."""
    before = torch.get_num_threads()
    if device.type != "cpu" or before == n:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


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

    def release(self) -> None:
        """Drop the VAE's weights (worker processes decode for this process): what admission reads stays."""
        self.vae = None

    def peak_bytes(self, shape: tuple[int, ...]) -> int:
        """Host memory decoding latents of ``shape`` takes at its peak with this VAE (``decode_peak_bytes``)."""
        return decode_peak_bytes(tuple(shape), self.base_dim, self.weight_bytes, self.device.type == "cpu", self.spatial)

    @property
    def min_rows(self) -> int:
        """Rows the VAE is given at least (``MIN_CPU_ROWS`` on the CPU, 1 on a GPU)."""
        return MIN_CPU_ROWS if self.device.type == "cpu" else 1

    def decode(self, latents: np.ndarray, sigma_data: float = 1.0, refused: dict[int, str] | None = None) -> tuple[np.ndarray, float]:
        """(uint8 frames [B, T, H, W, 3], seconds the decode took) of normalised latents [B, 16, T_lat, h, w].

        A rollout whose latents or decoded pixels are not finite (NaN, an overflow inside the VAE) would
        decode to a black video: it is named in ``refused`` (index -> reason; its frames are zeros and are
        not to be scored), and the others keep theirs. Without ``refused`` such a rollout is an ``InputError``.
        Rollouts already in ``refused`` are decoded from zeros, so they cannot touch the others.
        A rollout's frames do not depend on the others of ``latents`` (see the module's docstring)."""
        given = {} if refused is None else refused
        (frames, seconds), = self.decode_batch([(latents, sigma_data, given)])
        if refused is None and given:
            raise InputError("latents", "; ".join(given[i] for i in sorted(given)))
        return frames, seconds

    @torch.inference_mode()
    def decode_batch(self, requests: list[tuple[np.ndarray, float, dict[int, str]]]) -> list[tuple[np.ndarray, float]]:
        """``decode`` of several requests' latents (each ``(latents, sigma_data, refused)``, all of one shape past the
        batch) in one VAE call: each request's (frames, seconds), the seconds those of the whole call, less any wait
        for the VAE. Each ``refused`` gains that request's rollouts whose decoded frames are not finite."""
        t = time.perf_counter()
        zs = []
        for latents, sigma_data, given in requests:
            z = torch.from_numpy(np.array(latents, dtype=np.float32)) / sigma_data  # a copy: the body's bytes are read-only
            z = z * self.std + self.mean
            self._drop(z, given, "its latents are not finite once divided by sigma_data")
            zs.append(z)
        z = zs[0] if len(zs) == 1 else torch.cat(zs)
        del zs
        rows = z.shape[0]
        if rows < self.min_rows:  # the same kernels as a batch's (module docstring); the padding rows are dropped below
            z = torch.cat([z, z.new_zeros((self.min_rows - rows, *z.shape[1:]))])
        waited = time.perf_counter()
        with self._vae_lock, _cpu_threads(self.device, CPU_THREADS):  # the seconds returned leave out this wait for another batch's VAE call
            waited = time.perf_counter() - waited
            x = self.vae.decode(z.to(self.device, self.dtype)).sample[:rows]  # [B, 3, T, H, W] in [-1, 1]
        del z
        out, at = [], 0
        for latents, _, given in requests:
            b = latents.shape[0]
            part = x[at : at + b]
            at += b
            self._drop(part, given, "its decoded frames are not finite (the VAE overflowed)")
            out.append(self._levels(part))
        del x
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - t - waited
        return [(frames, seconds) for frames in out]

    @staticmethod
    def _levels(x: torch.Tensor) -> np.ndarray:
        """uint8 frames [B, T, H, W, 3] of decoded pixels [B, 3, T, H, W] in [-1, 1]."""
        x = x.float()  # a copy only when the VAE ran in bfloat16 (a GPU); in place from here on
        levels = x.add_(1.0).mul_(127.5).round_().clamp_(0, 255).to(torch.uint8)
        del x
        return levels.permute(0, 2, 3, 4, 1).contiguous().cpu().numpy()

    @staticmethod
    def _drop(x: torch.Tensor, refused: dict[int, str], why: str) -> None:
        """Zero (in place) the rollouts of ``x`` [B, ...] that are refused or not finite, naming the new ones in ``refused``."""
        for i in range(x.shape[0]):
            if i not in refused and not bool(torch.isfinite(x[i]).all()):
                refused[i] = f"rollout {i}: {why}; it is not scored"
            if i in refused:
                x[i].zero_()


class _Pending:
    __slots__ = ("latents", "sigma_data", "refused", "future", "key", "share")

    def __init__(self, latents: np.ndarray, sigma_data: float, refused: dict[int, str], group: Any):
        self.latents, self.sigma_data, self.refused = latents, sigma_data, refused
        self.future: Future = Future()
        self.key = (tuple(latents.shape[1:]), group)
        self.share = 0  # rows a worker takes of this rollout's group, once the group has been split


_STOP = object()


class DecodeQueue:
    """The service's decodes: threads taking what is queued and decoding the rollouts of one group (a prompt's, of one
    latent shape), from any requests, in one VAE call (up to ``MAX_BATCH_ROWS``), so a group's B = 1 rollouts decode
    as one batch.

    ``workers`` are what decode (``decode_batch`` as ``LatentDecoder``'s): the decoder itself by default (one thread),
    or worker processes (nvrm.serve.protocols.cosmos.decode_workers), one thread each. A batch goes to one worker, and a group's rows are
    split in equal shares, one per worker (8 rows, 2 workers: 4 each), so a group decodes on every worker at once.

    It is the first stage of a pipeline: while the scorer thread scores one group's frames, the workers decode the next
    group's (the oldest group waiting goes first). A group's rollouts that arrive while it decodes go in a later batch;
    the queue waits ``GATHER_S`` after each arrival for the rest of a group. A batch whose VAE call fails is decoded
    again request by request, so one request's failure reaches only that request."""

    def __init__(self, decoder: LatentDecoder, max_rows: int = MAX_BATCH_ROWS, gather_s: float = GATHER_S, gather_max_s: float = GATHER_MAX_S,
                 workers: list[Any] | None = None):
        self.decoder, self.max_rows, self.gather_s, self.gather_max_s = decoder, max_rows, gather_s, gather_max_s
        self.workers = list(workers) if workers else [decoder]
        self._queue: "queue.Queue[Any]" = queue.Queue()
        self._waiting: list[_Pending] = []  # taken from the queue, not decoded yet (another shape, or past a share)
        self._gathering = threading.Lock()  # one thread gathers at a time; the others decode meanwhile
        self._stopping = False
        self.batches = 0
        """VAE calls made (for tests and metrics)."""
        self._threads = [threading.Thread(target=self._loop, args=(w,), name=f"nvrm-decode-{i}", daemon=True) for i, w in enumerate(self.workers)]
        for t in self._threads:
            t.start()

    def submit(self, latents: np.ndarray, sigma_data: float = 1.0, refused: dict[int, str] | None = None, group: Any = None) -> Future:
        """A future of ``(frames, seconds)``: ``LatentDecoder.decode(latents, sigma_data, refused)``, in one batch with
        the other rollouts of ``group`` (any hashable: the prompt) and their shape."""
        p = _Pending(latents, sigma_data, {} if refused is None else refused, group)
        self._queue.put(p)
        return p.future

    def close(self, timeout: float = 5.0, workers: bool = True) -> None:
        """Decode what is queued, then stop the threads and (unless ``workers`` is false) the worker processes, within
        about ``timeout`` in all: a worker still decoding then (or hung) is killed, never waited for."""
        end = time.monotonic() + timeout
        self._queue.put(_STOP)
        for t in self._threads:
            t.join(max(0.0, end - time.monotonic()))
        for w in self.workers if workers else ():
            if w is not self.decoder and hasattr(w, "close"):
                w.close(max(0.5, end - time.monotonic()))

    def _take(self, timeout: float | None) -> Any:
        return self._queue.get(timeout=timeout) if timeout is None or timeout > 0 else self._queue.get_nowait()

    def _gather(self) -> list[_Pending]:
        """The next batch (the oldest waiting rollout's group, this worker's share of it); [] once stopping."""
        if self._stopping:
            return [self._waiting.pop(0)] if self._waiting else []
        if not self._waiting:
            first = self._take(None)
            if first is _STOP:
                self._stopping = True
                return []
            self._waiting.append(first)
        key = self._waiting[0].key
        started = time.monotonic()
        while not self._waiting[0].share and sum(p.latents.shape[0] for p in self._waiting if p.key == key) < self.max_rows:
            wait = min(self.gather_s, started + self.gather_max_s - time.monotonic())
            try:
                nxt = self._take(wait)
            except queue.Empty:
                break
            if nxt is _STOP:
                self._stopping = True
                break
            self._waiting.append(nxt)
        # a group is split in equal shares, one per worker; the first split fixes the share for the rest of the group
        share = self._waiting[0].share or min(self.max_rows, -(-sum(p.latents.shape[0] for p in self._waiting if p.key == key) // len(self.workers)))
        batch, rows, rest = [], 0, []
        for p in self._waiting:
            if p.key == key and (not batch or rows + p.latents.shape[0] <= share):
                batch.append(p)
                rows += p.latents.shape[0]
            else:
                rest.append(p)
                if p.key == key:
                    p.share = share
        self._waiting = rest
        return batch

    def _loop(self, worker: Any) -> None:
        while True:
            with self._gathering:
                batch = self._gather()
                if not batch:
                    if self._stopping:
                        self._queue.put(_STOP)  # for the other threads
                        return
                    continue
            self._decode(batch, worker)
            del batch

    def _decode(self, batch: list[_Pending], worker: Any) -> None:
        live = [p for p in batch if p.future.set_running_or_notify_cancel()]
        if not live:
            return
        self.batches += 1
        try:
            out = worker.decode_batch([(p.latents, p.sigma_data, p.refused) for p in live])
        except Exception:  # noqa: BLE001 - decoded again one request at a time: an error reaches only its request
            if len(live) == 1:
                live[0].future.set_exception(sys.exc_info()[1])  # type: ignore[arg-type]
                return
            for p in live:
                try:
                    p.future.set_result(worker.decode_batch([(p.latents, p.sigma_data, p.refused)])[0])
                except Exception as e:  # noqa: BLE001
                    p.future.set_exception(e)
            return
        for p, r in zip(live, out):
            p.future.set_result(r)
