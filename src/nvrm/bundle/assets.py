"""A bundle's config, tokenizer and processor files in the transformers 4.x layout, written from plain values.

The release is read by transformers 4.57.6, and a bundle must load there whatever transformers
wrote it. transformers 5's ``save_pretrained`` writes another layout (``rope_parameters`` in
place of ``rope_scaling`` / ``rope_theta``, one ``processor_config.json``, no ``vocab.json``),
which 4.57.6 cannot read, so nvrm writes these files itself: the same bytes on every version.
The files are the ones 4.57.6's ``save_pretrained`` writes (``tests/versions/test_bundle_layout.py``
compares them there).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

LAYOUT_VERSION = "4.57.6"
"""The transformers release whose file layout these are (recorded as ``transformers_version``)."""


def _dump(path: Path, body: Any) -> None:
    path.write_text(json.dumps(body, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def qwen3_vl_config(text: dict[str, Any], vision: dict[str, Any], token_ids: dict[str, int], *, dtype: str = "bfloat16") -> dict[str, Any]:
    """``config.json`` of a bare ``Qwen3VLModel`` (4.x layout) from its text and vision settings.

    ``text`` must hold the sizes (``vocab_size``, ``hidden_size``, ``intermediate_size``,
    ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``), the
    RoPE settings (``rope_theta``, ``rope_scaling``) and the special ids; ``vision`` the tower's.
    ``token_ids``: ``image_token_id``, ``video_token_id``, ``vision_start_token_id``, ``vision_end_token_id``.
    """
    text_config = {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "max_position_embeddings": 262144,
        "model_type": "qwen3_vl_text",
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": True,
        "use_cache": True,
        **text,
    }
    vision_config = {
        "hidden_act": "gelu_pytorch_tanh",
        "in_channels": 3,
        "initializer_range": 0.02,
        "model_type": "qwen3_vl",
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        **vision,
    }
    return {
        "architectures": ["Qwen3VLModel"],
        "dtype": dtype,
        "model_type": "qwen3_vl",
        "text_config": text_config,
        "tie_word_embeddings": True,
        "transformers_version": LAYOUT_VERSION,
        "vision_config": vision_config,
        **token_ids,
    }


def write_config(bundle: Path, config: dict[str, Any]) -> Path:
    path = Path(bundle) / "config.json"
    _dump(path, config)
    return path


def _token_entry(content: str, special: bool | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"content": content, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}
    if special is not None:
        entry["special"] = special
    return entry


def write_tokenizer(
    bundle: Path,
    tokenizer,
    special_tokens: Sequence[str],
    *,
    eos_token: str,
    pad_token: str,
    model_max_length: int = 262144,
    processor_class: str = "Qwen3VLProcessor",
) -> list[str]:
    """A byte-level BPE ``tokenizers.Tokenizer`` whose ``special_tokens`` are added as special tokens, as
    ``Qwen2TokenizerFast`` saves it: ``tokenizer.json``, ``vocab.json``, ``merges.txt``,
    ``tokenizer_config.json``, ``special_tokens_map.json``, ``added_tokens.json``. Returns the names."""
    bundle = Path(bundle)
    tokenizer.save(str(bundle / "tokenizer.json"))
    tokenizer.model.save(str(bundle))  # vocab.json, merges.txt
    ids = {t: tokenizer.token_to_id(t) for t in special_tokens}
    missing = [t for t, i in ids.items() if i is None]
    if missing:
        raise ValueError(f"special tokens not in the tokenizer: {', '.join(missing)}")
    _dump(
        bundle / "tokenizer_config.json",
        {
            "added_tokens_decoder": {str(i): _token_entry(t, True) for t, i in sorted(ids.items(), key=lambda kv: kv[1])},
            "additional_special_tokens": list(special_tokens),
            "bos_token": None,
            "clean_up_tokenization_spaces": False,
            "eos_token": eos_token,
            "extra_special_tokens": {},
            "model_max_length": model_max_length,
            "pad_token": pad_token,
            "processor_class": processor_class,
            "tokenizer_class": "Qwen2Tokenizer",
            "unk_token": None,
        },
    )
    _dump(
        bundle / "special_tokens_map.json",
        {
            "additional_special_tokens": [_token_entry(t) for t in special_tokens],
            "eos_token": _token_entry(eos_token),
            "pad_token": _token_entry(pad_token),
        },
    )
    _dump(bundle / "added_tokens.json", dict(sorted(ids.items())))
    return ["tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json"]


def _processor_common(patch_size: int, temporal_patch_size: int, merge_size: int, mean: Sequence[float], std: Sequence[float]) -> dict[str, Any]:
    return {
        "crop_size": None,
        "data_format": "channels_first",
        "default_to_square": True,
        "device": None,
        "do_center_crop": None,
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": list(mean),
        "image_std": list(std),
        "input_data_format": None,
        "merge_size": merge_size,
        "pad_size": None,
        "patch_size": patch_size,
        "processor_class": "Qwen3VLProcessor",
        "resample": 3,
        "rescale_factor": 0.00392156862745098,
        "temporal_patch_size": temporal_patch_size,
    }


def write_processor(
    bundle: Path,
    chat_template: str,
    *,
    patch_size: int = 16,
    temporal_patch_size: int = 2,
    merge_size: int = 2,
    mean: Sequence[float] = (0.5, 0.5, 0.5),
    std: Sequence[float] = (0.5, 0.5, 0.5),
    image_size: tuple[int, int] = (65536, 16777216),
    video_size: tuple[int, int] = (4096, 25165824),
) -> list[str]:
    """A ``Qwen3VLProcessor``'s files: ``preprocessor_config.json`` (image processor; note its own pixel
    bounds, ``image_size`` (shortest, longest edge), differ from the contract's),
    ``video_preprocessor_config.json`` and ``chat_template.jinja``. Returns the names."""
    bundle = Path(bundle)
    common = _processor_common(patch_size, temporal_patch_size, merge_size, mean, std)
    _dump(
        bundle / "preprocessor_config.json",
        {
            **common,
            "disable_grouping": None,
            "do_pad": None,
            "image_processor_type": "Qwen2VLImageProcessorFast",
            "max_pixels": None,
            "min_pixels": None,
            "return_tensors": None,
            "size": {"longest_edge": image_size[1], "shortest_edge": image_size[0]},
        },
    )
    _dump(
        bundle / "video_preprocessor_config.json",
        {
            **common,
            "do_sample_frames": True,
            "fps": 2,
            "max_frames": 768,
            "min_frames": 4,
            "num_frames": None,
            "return_metadata": False,
            "size": {"longest_edge": video_size[1], "shortest_edge": video_size[0]},
            "video_metadata": None,
            "video_processor_type": "Qwen3VLVideoProcessor",
        },
    )
    (bundle / "chat_template.jinja").write_text(chat_template, encoding="utf-8")
    return ["preprocessor_config.json", "video_preprocessor_config.json", "chat_template.jinja"]
