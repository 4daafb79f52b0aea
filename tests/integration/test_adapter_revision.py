"""The RL adapters in URL mode name a served model (``model=``) and pin its revision (``revision=``, sent as
``expect_revision``); a mismatch is one line, and the revision that scored each row is logged (issue 39)."""

import httpx
import pytest

from nvrm import Clip, make_reward_fn
from nvrm.errors import ConfigError, RevisionMismatch
from nvrm.rl.trl import trl_reward
from nvrm.rl.verl import verl_compute_score
from nvrm.serve.models.weights import manifest_sha256
from nvrm.synth.clips import moving_square
from helpers import InProcessServer

CTX = Clip(moving_square(2, 64, 32, seed=1), fps=1)
CANDS = [Clip(moving_square(5, 64, 32, seed=20 + i, speed=1 + i), fps=1) for i in range(3)]


@pytest.fixture(scope="module")
def server(model):
    s = InProcessServer(model, max_wait_ms=2)
    yield s
    s.stop()


def through(server):
    """URL mode over the in-process app: the adapter builds its own client from the URL and these settings."""
    return {"http": server.http, "ahttp": httpx.AsyncClient(transport=httpx.ASGITransport(server.app), base_url=server.url)}


def test_a_pinned_revision_the_server_is_not_at_is_one_line(server, tiny_bundle):
    fn = make_reward_fn(server.url, model="nvrm", revision="feedbeef", retries=0, **through(server))
    with pytest.raises(RevisionMismatch) as e:
        fn(["p"] * 3, [CTX] * 3, CANDS)
    message = str(e.value)
    assert "\n" not in message and "feedbeef" in message and manifest_sha256(tiny_bundle) in message, message
    assert e.value.status == 409


def test_the_served_revision_pinned_scores_and_is_logged_per_row(server, tiny_bundle, model):
    rev = manifest_sha256(tiny_bundle)
    fn = make_reward_fn(server.url, model="nvrm", revision=rev, **through(server))
    assert fn(["p"] * 3, [CTX] * 3, CANDS) == [model.score("p", CTX, c).reward for c in CANDS]

    reward = trl_reward(server.url, candidate_key="cand", model="nvrm", revision=rev, **through(server))
    metrics, extra = {}, {}
    reward(prompts=["p"] * 3, completions=["a", "b", "c"], context_video=[CTX] * 3, cand=CANDS,
           log_metric=metrics.__setitem__, log_extra=extra.__setitem__)
    assert extra["nvrm_reward/revision"] == [rev] * 3 and metrics["nvrm_reward/revisions"] == 1

    score = verl_compute_score(server.client(expect_revision=rev), candidate_key="cand")
    out = score.batch(solution_strs=["a", "b"], extra_infos=[{"prompt": "p", "context_video": CTX, "cand": c} for c in CANDS[:2]])
    assert [o["nvrm_revision"] for o in out] == [rev, rev] and all(o["nvrm_ok"] == 1.0 for o in out)


def test_an_unknown_served_model_and_model_in_process_are_refused(server, tiny_bundle):
    from nvrm.errors import RewardFnError

    with pytest.raises(RewardFnError, match="nope"):  # the server's 400 lists the served names
        make_reward_fn(server.url, model="nope", retries=0, **through(server))(["p"], [CTX], CANDS[:1])
    with pytest.raises(ConfigError, match="model='mine': names a model of nvrm serve"):
        make_reward_fn(str(tiny_bundle), model="mine")
