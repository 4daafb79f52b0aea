"""The one grouping rule of every RL adapter (pure)."""

import numpy as np

from nvrm import Clip
from nvrm.rl.scorer import group_items


def test_items_that_share_prompt_and_context_form_a_group():
    clip = Clip(np.zeros((2, 8, 8, 3), np.uint8), fps=1)
    frames = np.zeros((2, 8, 8, 3), np.uint8)
    prompts = ["a", "a", "b", "a", "a", "a", "a", "a", "a", "a"]
    contexts = ["x.mp4", "./x.mp4", "x.mp4", clip, clip, frames, frames, frames.copy(), None, b"\x00"]
    # a path in any spelling; bytes, arrays and clips by content (a copy is the same context); no context: one per prompt
    assert group_items(prompts, contexts) == [[0, 1], [2], [3, 4], [5, 6, 7], [8], [9]]
    assert group_items(prompts + ["a"], contexts + [bytes(b"\x00")]) == [[0, 1], [2], [3, 4], [5, 6, 7], [8], [9, 10]]
