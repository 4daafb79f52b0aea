"""make_reward_fn's grouping plan (pure)."""


def test_reward_fn_groups_items_that_share_prompt_and_context():
    import numpy as np

    from nvrm import Clip
    from nvrm.rewardfn import plan_groups

    clip = Clip(np.zeros((2, 8, 8, 3), np.uint8), fps=1)
    prompts = ["a", "a", "b", "a", "a", "a"]
    contexts = ["x.mp4", "x.mp4", "x.mp4", clip, clip, object()]
    assert plan_groups(prompts, contexts) == [[0, 1], [2], [3, 4], [5]]
