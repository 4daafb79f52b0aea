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

    from nvrm.serve.latents import LatentDecoder

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
    from nvrm.serve.latents import DecodeQueue

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
