"""The latent decoder batches without changing a frame (issue 38 item 5): a rollout decodes to the same uint8 frames,
bit for bit, alone or beside others, so the service's ``DecodeQueue`` may decode a group's B = 1 rollouts in one VAE
call and its rewards still equal in-process ``score_group`` on ``LatentDecoder.decode``'s frames."""

from __future__ import annotations

import threading

import numpy as np
import pytest

pytest.importorskip("diffusers")

SHAPE = (16, 2, 2, 2)  # [C, T_lat, h, w]: 5 frames of 16x16, small enough that one row takes PyTorch's im2col kernel


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    import torch
    from diffusers import AutoencoderKLWan

    from nvrm.serve.protocols.cosmos.latents import LatentDecoder

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("wan") / "tiny-wan2.1-vae"
    AutoencoderKLWan(base_dim=8, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=1, attn_scales=[],
                     temperal_downsample=[False, True, True]).save_pretrained(str(folder))
    return LatentDecoder(folder, "cpu")


def _latents(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, *SHAPE)).astype(np.float16)


def test_a_rollout_decodes_alike_alone_and_in_any_batch(decoder):
    z = _latents(5)
    whole, _ = decoder.decode(z)
    alone = np.concatenate([decoder.decode(z[i : i + 1])[0] for i in range(5)])
    split = np.concatenate([decoder.decode(z[:2])[0], decoder.decode(z[2:])[0]])
    assert whole.shape == (5, 5, 16, 16, 3) and whole.dtype == np.uint8
    assert len({whole[i].tobytes() for i in range(5)}) == 5  # five different videos, not one repeated
    for i in range(5):
        assert np.array_equal(whole[i], alone[i]), f"rollout {i}: batch of 5 vs alone"
        assert np.array_equal(whole[i], split[i]), f"rollout {i}: batch of 5 vs 2 + 3"


def test_the_decode_queue_batches_requests_and_keeps_their_frames(decoder):
    from nvrm.serve.protocols.cosmos.latents import DecodeQueue

    q = DecodeQueue(decoder, gather_s=0.5, gather_max_s=5.0)  # generous: the 4 submits below land in one batch
    try:
        zs = [_latents(1, seed) for seed in range(4)]
        bad = _latents(2, 9)
        bad[1, 0, 0, 0, 0] = np.nan
        refused: dict[int, str] = {1: "rollout 1: its latents are not finite (1 NaN or infinite values); it is not scored"}
        other = np.random.default_rng(7).standard_normal((1, 16, 2, 2, 4)).astype(np.float32)  # another shape: its own batch
        futures = [None] * 7
        go = threading.Barrier(7)

        def submit(i: int) -> None:
            go.wait()
            if i < 4:
                futures[i] = q.submit(zs[i], 1.0, {}, group="a prompt")
            else:
                futures[i] = q.submit(*((bad, 1.0, refused, "a prompt") if i == 4 else (other, 1.0, {}, "a prompt") if i == 5
                                        else (zs[0], 1.0, {}, "another prompt")))

        threads = [threading.Thread(target=submit, args=(i,)) for i in range(7)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        out = [f.result(timeout=600) for f in futures]
    finally:
        q.close()
    assert q.batches == 3, q.batches  # the 5 requests of one prompt and shape in one VAE call; the other shape, the other prompt
    for i in range(4):
        assert np.array_equal(out[i][0], decoder.decode(zs[i])[0]), f"request {i}"
    frames, seconds = out[4]
    assert seconds > 0 and sorted(refused) == [1] and (frames[1] == 128).all()  # the NaN rollout: mid-grey, named, not scored
    assert np.array_equal(frames[0], decoder.decode(bad[:1])[0][0])  # its neighbour unharmed
    assert np.array_equal(out[5][0], decoder.decode(other)[0])
    assert np.array_equal(out[6][0], out[0][0])


def test_a_cpu_decode_runs_on_one_thread_and_gives_the_threads_back(decoder):
    import torch

    before = torch.get_num_threads()
    seen = []
    vae = decoder.vae
    real = vae.decode
    vae.decode = lambda z: seen.append(torch.get_num_threads()) or real(z)
    try:
        decoder.decode(_latents(2))
    finally:
        del vae.decode
    assert seen == [1] and torch.get_num_threads() == before


@pytest.fixture(scope="module")
def workers(decoder):
    from nvrm.serve.protocols.cosmos.decode_workers import start_workers

    ws = start_workers(decoder.path, 2)
    yield ws
    for w in ws:
        w.close()


@pytest.mark.slow
def test_decode_workers_split_a_group_and_give_the_frames_of_the_decoder_in_process(decoder, workers):
    from nvrm.serve.protocols.cosmos.latents import DecodeQueue

    sizes: list[int] = []
    for w in workers:  # each batch's rows, as the workers receive them
        real = w.decode_batch
        w.decode_batch = (lambda real: lambda requests: sizes.append(sum(z.shape[0] for z, _, _ in requests)) or real(requests))(real)
    q = DecodeQueue(decoder, gather_s=0.5, gather_max_s=5.0, workers=workers)
    try:
        zs = [_latents(1, seed) for seed in range(8)]
        bad = _latents(1, 20)
        bad[0, 0, 0, 0, 0] = np.inf
        refused: dict[int, str] = {}
        futures = [q.submit(z, 1.0, {}, group="a prompt") for z in zs[:7]] + [q.submit(bad, 1.0, refused, group="a prompt")]
        out = [f.result(timeout=600) for f in futures]
    finally:
        q.close(workers=False)  # the workers stay up for the next test
        for w in workers:
            del w.decode_batch
    assert sorted(sizes) == [4, 4], sizes  # one group of 8, half on each worker
    for i in range(7):
        assert np.array_equal(out[i][0], decoder.decode(zs[i])[0]), f"rollout {i}"
    assert sorted(refused) == [0] and "not finite" in refused[0]  # named by the worker, told to this process


@pytest.mark.slow
def test_a_decode_worker_killed_mid_batch_loses_no_rollout_and_starts_again(decoder, workers):
    import os
    import signal
    import time

    from nvrm.serve.protocols.cosmos.latents import DecodeQueue

    w = workers[0]
    big = np.random.default_rng(5).standard_normal((2, 16, 9, 8, 12)).astype(np.float16)  # about a second of decoding
    want = decoder.decode(big)[0]
    q = DecodeQueue(decoder, workers=[w])
    try:
        starts, pid = w.starts, w.pid
        future = q.submit(big, 1.0, {}, group="p")
        time.sleep(0.3)  # the worker has the batch now
        os.kill(pid, signal.SIGKILL)
        frames, _ = future.result(timeout=600)
    finally:
        q.close(workers=False)
    assert np.array_equal(frames, want)
    assert w.starts == starts + 1 and w.pid != pid


def test_a_vae_folder_a_worker_cannot_load_is_one_line_naming_it(tmp_path):
    from nvrm.errors import ConfigError
    from nvrm.serve.protocols.cosmos.decode_workers import start_workers

    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError) as e:
        start_workers(str(tmp_path), 1)
    assert str(tmp_path) in str(e.value) and "\n" not in str(e.value)
