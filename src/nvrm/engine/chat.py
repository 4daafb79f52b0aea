"""Chat layout -> processor inputs for one (prompt, context, candidate).

Layout (contract): one user message whose content is the text
``"{prompt}\\nPreceding video:\\n"``, the context frames as images, the text
``"\\nCandidate continuation:\\n"`` and the candidate frames as images,
rendered with the bundle's own chat template (generation prompt on, thinking
off). The processor gets the contract's pixel bounds explicitly: its own
defaults differ and would resize the already-resized frames a second time.
"""

from __future__ import annotations

from typing import Any

from ..contract import Contract
from ..errors import InputError


def build_messages(prompt: str, n_context: int, n_candidate: int, contract: Contract) -> list[dict[str, Any]]:
    content: list[dict[str, Any]] = [{"type": "text", "text": contract.context_header.replace("{prompt}", prompt)}]
    content += [{"type": "image"} for _ in range(n_context)]
    content.append({"type": "text", "text": contract.candidate_header})
    content += [{"type": "image"} for _ in range(n_candidate)]
    return [{"role": "user", "content": content}]


def render(processor, prompt: str, n_context: int, n_candidate: int, contract: Contract) -> str:
    if not isinstance(prompt, str):
        raise InputError("prompt", f"must be a string, got {type(prompt).__name__}")
    return processor.apply_chat_template(
        build_messages(prompt, n_context, n_candidate, contract),
        tokenize=False,
        add_generation_prompt=contract.add_generation_prompt,
        enable_thinking=contract.enable_thinking,
    )


def images_kwargs(contract: Contract) -> dict:
    """The image processor's keywords for the contract's pixel bounds (the spelling every transformers reads)."""
    from ..forward.compat import pixel_bounds

    return pixel_bounds(contract.min_pixels, contract.max_pixels)


def _reserved_tokens(processor) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(vision tokens, other control tokens) a prompt may not contain; cached per processor."""
    cached = getattr(processor, "_nvrm_reserved", None)
    if cached is None:
        vision = tuple(
            t
            for t in (
                getattr(processor, "image_token", None),
                getattr(processor, "video_token", None),
                getattr(processor, "vision_start_token", None),
                getattr(processor, "vision_end_token", None),
                "<|vision_pad|>",
            )
            if t
        )
        special = tuple(sorted(set(processor.tokenizer.all_special_tokens) - set(vision)))
        cached = (vision, special)
        processor._nvrm_reserved = cached
    return cached


def check_prompt(processor, prompt: Any, limits=None) -> str:
    """The prompt, if the layout can carry it; an ``InputError`` naming the problem otherwise.

    Vision tokens (``<|image_pad|>`` ...) would break the image-token count,
    and control tokens (``<|im_end|>``, ``<|im_start|>``, ``<|endoftext|>``,
    the other special tokens) would end or restructure the chat turn, so both
    are refused. Ordinary added tokens (``<think>``, ``<tool_call>``) are
    tokenised exactly as the release's processor would.
    """
    if not isinstance(prompt, str):
        raise InputError("prompt", f"must be a string, got {type(prompt).__name__}")
    try:
        size = len(prompt.encode("utf-8"))
    except UnicodeEncodeError as e:
        raise InputError("prompt", f"is not valid Unicode text ({e.reason} at position {e.start})") from e
    if limits is not None and size > limits.max_prompt_tokens:
        # a byte-level BPE token covers at least one byte: only a long prompt needs counting, and a
        # prompt far over the limit is refused without tokenising it at all
        limits.check_prompt_bytes(size)
        limits.check_prompt_tokens(len(processor.tokenizer(prompt, add_special_tokens=False)["input_ids"]))
    vision, special = _reserved_tokens(processor)
    for token in vision:
        if token in prompt:
            raise InputError("prompt", f"contains the vision token {token!r}; prompts may not contain vision tokens")
    for token in special:
        if token in prompt:
            raise InputError(
                "prompt", f"contains the control token {token!r}, which would change the chat layout; remove it"
            )
    return prompt
