"""The scoring verbs of ``RewardModel``: one item, a batch, a group, a stream of groups, a comparison, a ranking.

``Scoring`` is what a loaded model does with its ``Pipeline`` (``nvrm.scoring.streaming``): every verb here
prepares through the engine, scores through the forward runtime and reports through the result maker,
and none of them knows how the parts were loaded (``reward_model.py`` does).
"""

from __future__ import annotations

from typing import Iterable, Iterator, Sequence

from ..engine import PreparedGroup, PreparedItem
from ..errors import NvrmError
from ..forward.prefix import Prefix
from ..results import ScoreResult
from ..video.inputs import VideoInput
from .items import Errors, GroupLike, ItemLike, RankEntry, bt_probability, rank_rewards
from .streaming import Pipeline, score_chunk, score_prepared_each, stream_batch, stream_groups


class Scoring:
    """Scoring verbs over ``self.pipeline`` (set by the model that mixes this in)."""

    pipeline: Pipeline

    def prepare(self, prompt: str, context: VideoInput, candidate: VideoInput) -> PreparedItem:
        """Apply the contract to one item: sample, transform and encode its frames (blocking)."""
        return self.pipeline.engine.prepare_item(prompt, context, candidate)

    def score_prepared(self, prepared: Sequence[PreparedItem], *, exact: bool | None = None) -> list[ScoreResult]:
        """Score prepared items in token-budgeted batches (or one by one with ``exact``); input order."""
        return self.pipeline.score_prepared(prepared, exact=exact)

    def score_prepared_each(self, prepared: Sequence[PreparedItem], *, exact: bool | None = None) -> list[ScoreResult | NvrmError]:
        """``score_prepared`` that never fails as a whole: a batch that fails unexpectedly is retried item by
        item, and what still fails is an error in its slot."""
        return score_prepared_each(self.pipeline, prepared, exact=exact)

    # ------------------------------------------------------------ scoring

    def score(self, prompt: str, context: VideoInput, candidate: VideoInput) -> ScoreResult:
        """Reward for one (prompt, context, candidate)."""
        prepared = self.prepare(prompt, context, candidate)  # within the sequence limit: the engine refuses it otherwise
        result = self.score_prepared([prepared], exact=True)[0]
        if isinstance(result, NvrmError):  # a non-finite reward: never returned as a result
            raise result
        return result

    def score_batch(self, items: Iterable[ItemLike], *, errors: Errors = "raise", exact: bool | None = None) -> list[ScoreResult | NvrmError]:
        """Rewards for many items, batched by token budget; results in input order.

        Args:
            items: ``ScoreItem``s, ``(prompt, context, candidate)`` triples or dicts with those keys.
            errors: ``"return"`` puts a bad item's error in its slot and scores the rest;
                ``"raise"`` raises the first bad item's error.
            exact: score every item alone: bit-identical to ``score`` (on the CPU, packed batches are too).

        Returns:
            One ``ScoreResult`` (or, with ``errors="return"``, ``NvrmError``) per item.
        """
        return stream_batch(self.pipeline, items, errors=errors, exact=exact)

    def score_group(
        self, prompt: str, context: VideoInput, candidates: Sequence[VideoInput], *, errors: Errors = "raise", exact: bool | None = None
    ) -> list[ScoreResult | NvrmError]:
        """Rewards for G candidates sharing one prompt and context (GRPO groups).

        The context is preprocessed and encoded by the vision tower once; one candidate of each
        length runs whole, keeping the prefix's KV, and the others run only their own tokens
        against it (chunks of ``group_chunk`` candidates for big groups, the prefix reused across
        chunks). On the CPU this equals ``score`` bit for bit (README, "Fidelity"); ``exact=True``
        scores each candidate alone instead. A bad context raises; a bad candidate raises or, with
        ``errors="return"``, yields its error in its slot.
        """
        [out] = list(stream_groups(self.pipeline, [(prompt, context, candidates)], errors=errors, exact=exact, lookahead=0, context_raises=True))
        return out

    def score_groups(
        self, groups: Iterable[GroupLike], *, errors: Errors = "return", exact: bool | None = None, lookahead: int | None = None
    ) -> Iterator[list[ScoreResult | NvrmError]]:
        """Score a stream of groups, preparing the next ones while the current one is on the model.

        Args:
            groups: ``(prompt, context, candidates)`` tuples (or dicts), consumed lazily.
            errors: ``"return"`` (default) puts errors in their slots (a bad
                context fills every slot of its group); ``"raise"`` raises the first.
            exact: score every candidate alone (see ``score_group``).
            lookahead: groups prepared ahead of the one being scored (default: the ``lookahead`` setting).

        Yields:
            One list per group, in order, one ``ScoreResult`` or ``NvrmError`` per candidate.
        """
        return stream_groups(self.pipeline, groups, errors=errors, exact=exact, lookahead=lookahead)

    def score_prepared_group(self, group: PreparedGroup, *, exact: bool | None = None) -> list[ScoreResult | NvrmError]:
        """Results for a group the engine prepared: one per candidate slot, errors in their slots."""
        results, _ = self.score_chunk(group, None, self.pipeline.settings.exact if exact is None else exact)
        return results

    def score_prepared_group_reusing(self, group: PreparedGroup, prefix: Prefix | None) -> tuple[list[ScoreResult | NvrmError], Prefix | None]:
        """Like :meth:`score_prepared_group` (not exact), reusing ``prefix`` when it is this group's.

        Returns the results and the prefix that was used (``prefix`` itself, extended, or a new one;
        None when no candidate could run), so a caller can keep it for later candidates of the same
        prompt and context."""
        return self.score_chunk(group, prefix, False)

    def score_chunk(self, group: PreparedGroup, prefix: Prefix | None, exact: bool) -> tuple[list[ScoreResult | NvrmError], Prefix | None]:
        """Score the good candidates of a prepared group (reusing ``prefix`` when it matches): the results
        in candidate order and the prefix used (``nvrm.scoring.streaming.score_chunk``)."""
        return score_chunk(self.pipeline, group, prefix, exact)

    def compare(self, prompt: str, context: VideoInput, a: VideoInput, b: VideoInput) -> float:
        """P(a preferred over b) under the Bradley-Terry model: sigmoid(r_a - r_b)."""
        ra, rb = self.score_group(prompt, context, [a, b])
        return bt_probability(ra.reward, rb.reward)  # type: ignore[union-attr]

    def rank(self, prompt: str, context: VideoInput, candidates: Sequence[VideoInput]) -> list[RankEntry]:
        """Candidates sorted best first (ties keep input order), each with its result and Bradley-Terry probabilities."""
        results = self.score_group(prompt, context, candidates)
        return rank_rewards([r.reward for r in results], results)  # type: ignore[union-attr,arg-type]
