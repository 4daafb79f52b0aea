"""Held-out evaluation on every rank: each scores its share of the pairs (no padding), rank 0 summarises all of them."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ..prefs.pairs import Pair
from ..report.evaluate import PairOutcome, summarize
from .data import Feed
from .dist import Ranks


@torch.no_grad()
def evaluate_on_ranks(module: torch.nn.Module, feed: Feed, ranks: Ranks, pairs: Sequence[Pair], batch_pairs: int) -> dict[str, Any]:
    """``report.evaluate.summarize`` of every pair's outcome, on every rank; ``module`` unwrapped (not DDP's forward:
    the shares may differ in size), the next batch prepared while one is scored."""
    module.eval()
    mine = [(i, pairs[i]) for i in range(ranks.rank, len(pairs), ranks.world)]
    outcomes: list[tuple[int, PairOutcome]] = []
    ahead = feed.submit(mine[:batch_pairs])
    for start in range(0, len(mine), batch_pairs):
        chunk = feed.collect(ahead)
        if start + batch_pairs < len(mine):
            ahead = feed.submit(mine[start + batch_pairs : start + 2 * batch_pairs])
        if chunk:
            rew = module([p.chosen for p in chunk] + [p.rejected for p in chunk])
            outcomes += [(p.index, PairOutcome(float(rew[k]), float(rew[len(chunk) + k]), p.pair.tie)) for k, p in enumerate(chunk)]
    gathered = ranks.gather(outcomes)
    summary = summarize([o for _, o in sorted(x for part in gathered for x in part)]) if ranks.is_main else None
    return ranks.share(summary)
