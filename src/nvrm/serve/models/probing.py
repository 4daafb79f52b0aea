"""``--probe-rate``: a sampled share of the scored items is probed, off the request path, as ``nvrm probe`` would.

A probed item's candidate (its sampled frames) gets one degrading perturbation of ``nvrm probe``'s (frozen,
reversed, shuffled, blurred, noisy, brighter, low resolution), picked at seeded random; the perturbed candidate
is scored against the same prompt and context on the same revision's scheduler, as a best-effort item that
never waits for queue room; and the monitor of that revision learns whether the perturbation scored above
the original (``Monitor.add_probe``). A policy gaming the reward shows as a high rate: a worse video should
never win.

Each probe costs one more item on the model; the rate is off (0) by default.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Sequence

import numpy as np

from ...guard.monitor import sampled

log = logging.getLogger(__name__)

PROBES = ("freeze", "reverse", "shuffle", "blur", "noise", "brightness", "lowres")
"""The degrading perturbations a sampled probe picks from (all work on the 1 FPS frames the contract samples)."""


class Prober:
    """Probes a sampled share of each request's scored items in a thread of its own (never blocking a request)."""

    def __init__(self, rate: float, seed: int = 0):
        self.rate, self.seed = rate, seed
        self._count = 0
        self._lock = threading.Lock()

    def offer(self, entry: Any, items: Sequence[tuple[str, Any, Any]], results: Sequence[Any]) -> None:
        """Queue the sampled ones of a request's scored ``items`` ((prompt, context Media, candidate Media)) for probing."""
        if self.rate <= 0 or entry.monitor is None:
            return
        picked = []
        for (prompt, context, candidate), result in zip(items, results):
            with self._lock:
                self._count += 1
                n = self._count
            if not isinstance(result, BaseException) and sampled(self.rate, f"{self.seed}|{n}"):
                picked.append((n, prompt, context, candidate, float(result.reward)))
        if picked:
            threading.Thread(target=self._run, args=(entry, picked), name="nvrm-probe", daemon=True).start()

    def _run(self, entry: Any, picked: list) -> None:
        for n, prompt, context, candidate, reward in picked:
            try:
                perturbed = self._perturbed(entry.model, prompt, candidate, n)
                scheduler = entry.scheduler
                if scheduler is None or perturbed is None or not scheduler.try_admit(1):
                    continue  # best effort: a busy or retired revision is not probed
                from ..admission.media import Media

                fut = scheduler.submit(prompt, context, Media(perturbed, ""), deadline=time.monotonic() + 60.0)
                out = fut.result(timeout=90)
                if not isinstance(out, BaseException):
                    entry.monitor.add_probe(float(out.reward) > reward)
            except Exception:  # noqa: BLE001 - a probe never disturbs the service
                log.debug("a sampled probe failed", exc_info=True)

    def _perturbed(self, model: Any, prompt: str, candidate: Any, n: int) -> Any:
        """The candidate's sampled frames through one seeded perturbation, as a 1 FPS clip."""
        from ...clip import Clip
        from ...probe.perturbations import PERTURBATIONS, ProbeItem
        from ...video.inputs import sample_input

        images, plan, _ = sample_input(candidate.value, "candidate", model.contract, model.limits)
        frames = np.stack([np.asarray(im) for im in images])
        fps = model.contract.sample_fps
        rng = np.random.default_rng([self.seed, n])
        name = PROBES[int(rng.integers(len(PROBES)))]
        item = ProbeItem(prompt, Clip(frames[:1], fps), Clip(frames, fps), window=len(frames) / fps)
        return PERTURBATIONS[name].apply(item, rng).candidate
