"""Real encoded inputs: the formats users hand in, and the ways files go wrong."""

import math

import av
import numpy as np
import pytest

from nvrm import Clip, ContractError, InputError
from nvrm.synth.clips import moving_square, write_audio_only, write_video
from nvrm.fidelity.reference import reference_images

FORMATS = {
    # name: (frames kwargs, fps, seconds, writer kwargs, suffix)
    "h264_420": (dict(height=96, width=128), 8, 6, dict(), ".mp4"),
    "grayscale": (dict(height=96, width=128), 8, 6, dict(codec="ffv1", pix_fmt="gray"), ".mkv"),
    "yuv444": (dict(height=96, width=128), 8, 6, dict(pix_fmt="yuv444p"), ".mp4"),
    "10bit": (dict(height=96, width=128), 8, 6, dict(pix_fmt="yuv420p10le"), ".mkv"),
    "portrait": (dict(height=160, width=96), 8, 6, dict(), ".mp4"),
    "60fps": (dict(height=144, width=176), 60, 6, dict(), ".mp4"),
    "tiny_qcif": (dict(height=144, width=176), 8, 6, dict(), ".mp4"),
    "4k": (dict(height=2160, width=3840), 2, 6, dict(), ".mp4"),
    "h264_bframes": (dict(height=96, width=128), 8, 6, dict(options={"bframes": "3", "preset": "medium"}), ".mp4"),
    "vp9_webm": (dict(height=96, width=128), 8, 6, dict(codec="libvpx-vp9"), ".webm"),
}


class _FormatClips(dict):
    """{format name: encoded clip}, each written the first time a test asks for it: the fast tier uses a few, and
    the 4K one takes seconds to encode."""

    def __init__(self, folder):
        super().__init__()
        self.folder = folder

    def __missing__(self, name):
        if name == "vfr":
            times = np.cumsum([0.0] + [0.1 if i % 2 else 0.2 for i in range(59)])  # variable frame rate, ~9 s
            path = write_video(self.folder / "vfr.mkv", moving_square(60, 96, 128, seed=9), 8, times=times)
        else:
            fkw, fps, secs, wkw, suffix = FORMATS[name]
            path = write_video(self.folder / f"{name}{suffix}", moving_square(fps * secs, **fkw, seed=len(name)), fps, **wkw)
        self[name] = path
        return path


@pytest.fixture(scope="module")
def format_clips(tmp_path_factory):
    return _FormatClips(tmp_path_factory.mktemp("formats"))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FORMATS) + ["vfr"])
def test_format_scores_and_matches_reference_frames(model, format_clips, name):
    path = format_clips[name]
    prepared = model.prepare("p", path, path)
    ref_ctx, ref_times = reference_images(path, "context", model.contract)
    assert prepared.context.times == pytest.approx(ref_times)
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(prepared.context.images, ref_ctx))
    assert len(prepared.candidate.images) == 5
    result = model.score("p", path, path)
    assert math.isfinite(result.reward)
    for im in prepared.candidate.images:
        assert im.mode == "RGB" and im.width % 32 == 0 and im.height % 32 == 0


def test_vfr_sampling_uses_presentation_times(model, format_clips):
    times = model.score("p", format_clips["vfr"], format_clips["h264_420"]).context_times
    # ticks 1, 4, 7 fall exactly between 0.9/1.1, 3.9/4.1 ... : the earlier frame wins
    assert times[:3] == pytest.approx((0.0, 0.9, 2.0))


def test_60fps_candidate_picks_exact_second_frames(model, format_clips):
    res = model.score("p", format_clips["h264_420"], format_clips["60fps"])
    assert res.candidate_times == pytest.approx((0.0, 1.0, 2.0, 3.0, 4.0))


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory, clips):
    d = tmp_path_factory.mktemp("bad")
    empty = d / "empty.mp4"
    empty.write_bytes(b"")
    text = d / "notes.mp4"
    text.write_text("this is not a video\n" * 50)
    good = clips["cand_a"].read_bytes()
    truncated = d / "truncated.mp4"
    truncated.write_bytes(good[: len(good) // 2])
    audio = write_audio_only(d / "audio.wav")
    mkv = write_video(d / "stream.mkv", moving_square(48, 96, 128), 8)
    cut_mkv = d / "cut.mkv"
    cut_mkv.write_bytes(mkv.read_bytes()[: int(mkv.stat().st_size * 0.4)])
    no_frames = d / "noframes.mkv"
    with av.open(str(no_frames), "w") as out:  # a video stream that never gets a frame
        s = out.add_stream("ffv1", rate=8)
        s.width, s.height, s.pix_fmt = 64, 64, "yuv420p"
        a = out.add_stream("pcm_s16le", rate=8000)
        a.layout = "mono"
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 800), np.int16), format="s16", layout="mono")
        frame.rate, frame.pts = 8000, 0
        for packet in a.encode(frame):
            out.mux(packet)
        for packet in a.encode():
            out.mux(packet)
    wide = write_video(d / "wide.mkv", np.zeros((48, 16, 3300, 3), np.uint8), 8, codec="ffv1", pix_fmt="yuv420p")
    return dict(empty=empty, text=text, truncated=truncated, audio=audio, cut_mkv=cut_mkv, no_frames=no_frames, wide=wide, missing=d / "missing.mp4")


@pytest.mark.parametrize(
    "name,slot,needle",
    [
        ("missing", "candidate", "file not found"),
        ("empty", "candidate", "file is empty (0 bytes)"),
        ("text", "context", "not a readable video"),
        ("truncated", "candidate", "not a readable video"),
        ("audio", "context", "has no video stream"),
        ("no_frames", "context", "no decodable video frames"),
        ("wide", "candidate", "at most 200:1"),
    ],
)
def test_bad_files_raise_one_line_named_errors(model, clips, bad_files, name, slot, needle):
    args = {"context": clips["context"], "candidate": clips["cand_a"]}
    args[slot] = bad_files[name]
    with pytest.raises(InputError) as e:
        model.score("p", args["context"], args["candidate"])
    msg = str(e.value)
    assert msg.startswith(f"{slot} {bad_files[name]}") and needle in msg and "\n" not in msg


def test_truncated_stream_is_an_error_not_a_silent_short_clip(model, clips, bad_files):
    with pytest.raises(InputError) as e:
        model.score("p", clips["context"], bad_files["cut_mkv"])
    assert "cut.mkv" in str(e.value)
    assert ("candidate is" in str(e.value)) or ("decoding failed" in str(e.value))


def test_short_candidate_is_a_contract_error(model, clips):
    with pytest.raises(ContractError, match=r"candidate .*short.mp4: candidate is 4\.00 s; the contract needs 5\.00 s"):
        model.score("p", clips["context"], clips["short"])


def test_bytes_input_equals_path_input(model, clips):
    by_path = model.score("p", clips["context"], clips["cand_a"]).reward
    by_bytes = model.score("p", clips["context"].read_bytes(), clips["cand_a"].read_bytes()).reward
    assert by_path == by_bytes
    with pytest.raises(InputError, match="video bytes are empty"):
        model.score("p", b"", clips["cand_a"])


def test_image_file_is_a_one_frame_context(model, clips, tmp_path):
    from PIL import Image

    img = tmp_path / "still.png"
    Image.fromarray(moving_square(1, 96, 128)[0]).save(img)
    res = model.score("p", img, clips["cand_a"])
    assert res.context_times == (0.0,)


def test_score_batch_can_return_errors_in_place(model, clips):
    items = [("p", clips["context"], clips["cand_a"]), ("p", clips["context"], clips["short"]), ("p", clips["context"], clips["cand_b"])]
    out = model.score_batch(items, errors="return")
    assert isinstance(out[1], ContractError)
    assert out[0].reward == model.score(*items[0]).reward and out[2].reward == model.score(*items[2]).reward
    with pytest.raises(ContractError):
        model.score_batch(items)


def test_max_context_frames_keeps_most_recent(tiny_bundle, clips):
    from nvrm import Contract, RewardModel

    m = RewardModel.from_pretrained(tiny_bundle, device="cpu", contract=Contract(max_context_frames=2))
    res = m.score("p", Clip(moving_square(40, 64, 80), fps=4), clips["cand_a"])
    assert res.context_times == (8.0, 9.0)


SEEKABLE = {
    # name: (writer kwargs, suffix); 24 fps, 12 s, so 1 FPS ticks skip most frames
    "mjpeg_intra": (dict(codec="mjpeg", pix_fmt="yuvj420p"), ".mkv"),
    "h264_gop24": (dict(options={"g": "24"}), ".mp4"),
    "h264_gop12_bframes": (dict(options={"g": "12", "bframes": "3", "preset": "medium"}), ".mp4"),
    "vp9_gop24": (dict(codec="libvpx-vp9", options={"g": "24"}), ".webm"),
}


@pytest.fixture(scope="module")
def seek_clips(tmp_path_factory):
    d = tmp_path_factory.mktemp("seek")
    return {
        name: write_video(d / f"{name}{suffix}", moving_square(24 * 12, 96, 128, seed=3), 24, **wkw)
        for name, (wkw, suffix) in SEEKABLE.items()
    }


@pytest.mark.parametrize("role", ["context", "candidate"])
@pytest.mark.parametrize("name", list(SEEKABLE) + ["h264_420", "h264_bframes", "vfr", "60fps"])
def test_seeking_decodes_the_same_frames_as_a_full_pass(model, seek_clips, format_clips, name, role):
    from nvrm.video.decode import read_sampled

    path = seek_clips.get(name) or format_clips[name]
    full = read_sampled(path, role, model.contract, strategy="sequential")
    seek = read_sampled(path, role, model.contract)
    assert seek.strategy == "seek", "the index should allow seeking on this clip"
    assert seek.plan == full.plan
    assert len(seek.images) == len(full.images)
    for a, b in zip(seek.images, full.images):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    if name in SEEKABLE:
        assert seek.decoded < full.decoded / 3, (seek.decoded, full.decoded)


def test_seeking_frames_carry_their_source_index(model, tmp_path):
    from nvrm.video.decode import read_sampled

    path = write_video(tmp_path / "ffv1.mkv", moving_square(24 * 12, 96, 128), 24, codec="ffv1", pix_fmt="yuv444p")
    got = read_sampled(path, "context", model.contract)
    assert got.strategy == "seek" and got.decoded < 24 * 12 / 3
    # moving_square writes the frame index (mod 256) into the red channel of the top-left block
    red = [int(np.asarray(im)[2, 2, 0]) for im in got.images]
    assert all(abs(r - (24 * k) % 256) <= 3 for k, r in enumerate(red)), red
