"""Token-budget batch planning (pure).

Items are sorted by length so that padding is small, then packed greedily
while ``batch_size * longest_length`` (the padded token count of a forward)
stays within the budget. An item longer than the budget still runs, alone.
"""

from __future__ import annotations

from typing import Sequence


def plan_batches(lengths: Sequence[int], max_batch_tokens: int) -> list[list[int]]:
    """Group item indices into forwards of at most ``max_batch_tokens`` padded key positions
    (rows x the longest row; see ``LoadSettings.max_batch_tokens``)."""
    if max_batch_tokens < 1:
        raise ValueError(f"max_batch_tokens must be >= 1, got {max_batch_tokens}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        width = max(longest, lengths[i])
        if current and width * (len(current) + 1) > max_batch_tokens:
            batches.append(current)
            current, width = [], lengths[i]
        current.append(i)
        longest = width
    if current:
        batches.append(current)
    return batches
