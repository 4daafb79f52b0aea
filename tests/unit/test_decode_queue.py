"""How ``DecodeQueue`` shares a group's rollouts among its workers (issue 38 item 5), with stand-in workers."""

from __future__ import annotations

import threading
import time

import numpy as np

from nvrm.serve.protocols.cosmos.latents import DecodeQueue


RUNNING = {"now": 0, "most": 0}
_COUNT = threading.Lock()


class Worker:
    """Answers a batch after ``seconds`` with one uint8 frame per row holding the row's first latent value; counts the
    batches decoding at once, over every worker, in ``RUNNING``."""

    def __init__(self, seconds: float = 0.2, fail_on: float | None = None):
        self.seconds, self.fail_on = seconds, fail_on
        self.batches: list[list[float]] = []

    def decode_batch(self, requests):
        with _COUNT:
            self.batches.append([float(z[0, 0]) for z, _, _ in requests])
            RUNNING["now"] += 1
            RUNNING["most"] = max(RUNNING["most"], RUNNING["now"])
        time.sleep(self.seconds)
        with _COUNT:
            RUNNING["now"] -= 1
        if self.fail_on is not None and any(float(z[0, 0]) == self.fail_on for z, _, _ in requests):
            raise RuntimeError(f"rollout {self.fail_on} breaks the batch")
        return [(np.full((z.shape[0], 1), int(z[0, 0]), dtype=np.uint8), self.seconds) for z, _, _ in requests]


def _rollout(v: float) -> np.ndarray:
    return np.full((1, 4), v, dtype=np.float32)


def _run(workers, groups: dict[str, list[float]], **kw):
    q = DecodeQueue(None, workers=workers, gather_s=0.2, gather_max_s=2.0, **kw)  # type: ignore[arg-type]
    try:
        futures = {(g, v): q.submit(_rollout(v), group=g) for g, vs in groups.items() for v in vs}
        return {k: f.result(timeout=30) for k, f in futures.items()}, q
    finally:
        q.close()


def test_two_workers_take_half_a_group_each_at_once():
    a, b = Worker(seconds=1.0), Worker(seconds=1.0)
    RUNNING["most"] = 0
    out, q = _run([a, b], {"p": [float(v) for v in range(8)]})
    assert sorted(len(x) for x in a.batches + b.batches) == [4, 4] and len(a.batches) == len(b.batches) == 1
    assert sorted(a.batches[0] + b.batches[0]) == [float(v) for v in range(8)]  # every rollout once
    assert all(int(f[0][0, 0]) == int(v) for (_, v), f in out.items())  # each its own frames back
    assert RUNNING["most"] == 2  # the two halves side by side, not one after the other


def test_one_worker_takes_the_whole_group_and_each_group_is_its_own_batch():
    w = Worker(seconds=0.05)
    _run([w], {"p": [1.0, 2.0, 3.0], "q": [4.0, 5.0]})
    assert sorted(sorted(b) for b in w.batches) == [[1.0, 2.0, 3.0], [4.0, 5.0]]


def test_an_odd_group_is_split_in_shares_of_the_first_split():
    a, b = Worker(), Worker()
    _run([a, b], {"p": [1.0, 2.0, 3.0]})
    assert sorted(len(x) for x in a.batches + b.batches) == [1, 2]


def test_a_failed_batch_is_decoded_again_request_by_request():
    w = Worker(seconds=0.01, fail_on=2.0)
    q = DecodeQueue(None, workers=[w], gather_s=0.2)  # type: ignore[arg-type]
    try:
        futures = [q.submit(_rollout(v), group="p") for v in (1.0, 2.0, 3.0)]
        errors = [f.exception(timeout=30) for f in futures]
    finally:
        q.close()
    assert errors[0] is None and errors[2] is None and "rollout 2.0" in str(errors[1])
    assert len(w.batches) == 4  # the batch of three, then each alone


def test_the_number_of_decode_workers():
    import pytest

    from nvrm.errors import ConfigError
    from nvrm.serve.config import ServeConfig
    from nvrm.serve.protocols.cosmos.decode_workers import auto_workers

    assert [auto_workers(t) for t in (0, 1, 2, 3, 16)] == [1, 1, 2, 3, 4]  # one per torch thread, at most 4
    assert ServeConfig(decode_workers=0).decode_workers == 0
    with pytest.raises(ConfigError, match="decode_workers=-2"):
        ServeConfig(decode_workers=-2)
