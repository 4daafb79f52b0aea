import json

import pytest

from nvrm import RELEASE_CONTRACT, BundleError, Contract
from nvrm.errors import ConfigError


def test_release_values_match_model_card():
    c = RELEASE_CONTRACT
    assert (c.candidate_seconds, c.sample_fps, c.resize_height, c.jpeg_quality) == (5.0, 1.0, 360, 85)
    assert (c.min_pixels, c.max_pixels) == (1024, 76800)
    assert c.resize_factor == 32  # 16-px patches merged 2x2, not Qwen2-VL's 28
    assert c.enable_thinking is False and c.normalize_hidden is False
    assert c.head_dtype == "bfloat16"
    assert c.candidate_frames == 5


def test_fingerprint_is_sha256_of_canonical_json_and_stable():
    import hashlib

    c = Contract()
    assert c.fingerprint == hashlib.sha256(c.to_json().encode()).hexdigest()
    assert Contract().fingerprint == c.fingerprint
    assert json.loads(c.to_json()) == c.to_dict()


@pytest.mark.parametrize(
    "field,value",
    [("jpeg_quality", 95), ("resize_height", 480), ("candidate_header", "\nNext:\n"), ("max_context_frames", 8)],
)
def test_fingerprint_changes_with_any_field(field, value):
    assert Contract(**{field: value}).fingerprint != Contract().fingerprint


def test_round_trip_through_dict():
    c = Contract(max_context_frames=4, jpeg_quality=90)
    assert Contract.from_dict(c.to_dict()) == c


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        ({"jpeg_quality": 0}, "jpeg_quality=0"),
        ({"min_pixels": 10, "max_pixels": 5}, "pixel bounds 10..5"),
        ({"sample_fps": 0}, "sample_fps=0"),
        ({"context_header": "no placeholder"}, "{prompt}"),
        ({"max_context_frames": 0}, "max_context_frames=0"),
    ],
)
def test_invalid_values_are_named(kwargs, needle):
    with pytest.raises(ConfigError, match="invalid contract") as e:  # a bad setting, made in code
        Contract(**kwargs)
    assert needle in str(e.value)


def test_unknown_override_field_is_refused(tmp_path):
    (tmp_path / "nvrm_contract.json").write_text(json.dumps({"jpeg_qualty": 90}))
    with pytest.raises(BundleError, match="jpeg_qualty"):
        Contract.for_bundle(tmp_path)


def test_bundle_overrides_apply_on_top_of_release(tmp_path):
    assert Contract.for_bundle(tmp_path) == RELEASE_CONTRACT
    (tmp_path / "nvrm_contract.json").write_text(json.dumps({"candidate_header": "\nNext clip:\n"}))
    c = Contract.for_bundle(tmp_path)
    assert c.candidate_header == "\nNext clip:\n" and c.jpeg_quality == 85
    assert c.fingerprint != RELEASE_CONTRACT.fingerprint
