"""Chat layout -> processor inputs for one (prompt, context, candidate).

Layout (contract): one user message whose content is the text
``"{prompt}\\nPreceding video:\\n"``, the context frames as images, the text
``"\\nCandidate continuation:\\n"`` and the candidate frames as images,
rendered with the bundle's own chat template (generation prompt on, thinking
off). The processor gets the contract's pixel bounds explicitly: its own
defaults differ and would resize the already-resized frames a second time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from PIL import Image

from .contract import Contract
from .errors import InputError


@dataclass(frozen=True)
class Encoded:
    """Model inputs for one item. Shapes: L tokens, P patches, I images."""

    input_ids: torch.Tensor  # [L] int64
    pixel_values: torch.Tensor  # [P, 3 * 2 * 16 * 16] float32
    image_grid_thw: torch.Tensor  # [I, 3] int64

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])


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


def images_kwargs(contract: Contract) -> dict[str, int]:
    return {"min_pixels": contract.min_pixels, "max_pixels": contract.max_pixels}


def encode(
    processor,
    prompt: str,
    context: Sequence[Image.Image],
    candidate: Sequence[Image.Image],
    contract: Contract,
) -> Encoded:
    """Tokenise the rendered layout and turn the prepared frames into patches."""
    text = render(processor, prompt, len(context), len(candidate), contract)
    out = processor(
        text=[text],
        images=list(context) + list(candidate),
        return_tensors="pt",
        images_kwargs=images_kwargs(contract),
    )
    return Encoded(out["input_ids"][0], out["pixel_values"], out["image_grid_thw"])
