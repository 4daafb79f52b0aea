"""What a forward computes besides the reward, kept per candidate for the guard (``nvrm.guard``).

A ``Tap`` rides along one forward (``forward_rewards``, ``prefill``, ``score_suffixes``,
``suffix_rewards``) and keeps, per candidate row, two things the model computes anyway:

- the mean vision-tower feature of each candidate frame (the merged tokens the language model
  reads, averaged per image): ``frames[row]`` is ``[n, H]``;
- the hidden state at the last token, the one the reward head reads: ``last[row]`` is ``[H]``.

Nothing is computed twice and nothing is copied off the device; a forward without a tap runs as
before. Tensors keep their autograd graph, so the differentiable reward's guard has gradients too.

Shapes: N merged tokens, I images, n candidate frames, H hidden.
"""

from __future__ import annotations

from typing import Sequence

import torch


class Tap:
    """Per candidate row: its frames' mean vision features and its last hidden state (float32, on the device)."""

    def __init__(self, merge: int, rows: Sequence[int] | None = None, parent: "Tap | None" = None):
        self.merge = int(merge)
        self.frames: dict[int, torch.Tensor] = {} if parent is None else parent.frames
        self.last: dict[int, torch.Tensor] = {} if parent is None else parent.last
        self._rows = None if rows is None else list(rows)

    def view(self, rows: Sequence[int]) -> "Tap":
        """A tap for a forward over some of this tap's rows: its row k is this tap's row ``rows[k]``."""
        return Tap(self.merge, [self._row(r) for r in rows], self)

    def _row(self, k: int) -> int:
        return k if self._rows is None else self._rows[k]

    def images(self, features: torch.Tensor, grids: torch.Tensor, owners: Sequence[int]) -> None:
        """Keep the mean feature of each image whose owner is a candidate row (``owners[i] >= 0``; -1: a context image).

        ``features``: [N, H], the images' merged tokens in order; ``grids``: [I, 3]."""
        if len(owners) != int(grids.shape[0]):
            raise ValueError(f"{len(owners)} owners for {int(grids.shape[0])} images")
        counts = (grids.prod(-1) // (self.merge * self.merge)).tolist()
        keep = [i for i, o in enumerate(owners) if o >= 0]
        if not keep:
            return
        per_image = torch.split(features, counts)
        means = {i: per_image[i].float().mean(0) for i in keep}
        rows: dict[int, list[torch.Tensor]] = {}
        for i in keep:
            rows.setdefault(owners[i], []).append(means[i])
        for row, parts in rows.items():
            self.frames[self._row(row)] = torch.stack(parts)

    def hidden(self, rows: Sequence[int], last: torch.Tensor) -> None:
        """Keep the last-token hidden state of each of ``rows`` (``last``: [len(rows), H])."""
        for k, row in enumerate(rows):
            self.last[self._row(row)] = last[k].float()


def item_owners(image_counts: Sequence[int], candidate_counts: Sequence[int]) -> list[int]:
    """Owners of a batch's images laid out item after item, each item's candidate images last (pure):
    item i's candidate images belong to row i, its context images to -1."""
    out: list[int] = []
    for row, (n, c) in enumerate(zip(image_counts, candidate_counts)):
        out += [-1] * (n - c) + [row] * c
    return out
