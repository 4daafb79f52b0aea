"""Where rewards come from, below every user of them: a model in process or a running ``nvrm serve`` by URL.

- ``reward_source``: ``RewardSource`` scores (prompt, context, candidate) items through either, grouped by
  shared (prompt, context), one result or error per item; used by the RL adapters (``nvrm.rl``) and by nvrm
  as a judge (``nvrm.prefs.judges``);
- ``identity``: when two inputs are one input (the grouping rule's key);
- ``pinning``: which served model and revision score a run, and which revision scored each item.
"""
