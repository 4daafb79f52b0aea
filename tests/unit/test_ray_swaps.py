"""The bookkeeping of a rolling swap over Ray Serve replicas (``nvrm.serve.ray.rolling_swap.RollingSwap``), without Ray."""

from nvrm.serve.ray.rolling_swap import STALE_S, RollingSwap


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def rollout(n=3):
    clock = Clock()
    r = RollingSwap({"nvrm": "/b/a", "mine": "/b/m"}, clock=clock)
    for i in range(n):
        assert r.claim(f"r{i}", {"nvrm": "/b/a", "mine": "/b/m"}) is None  # all on the target: nothing to do
    return r, clock


def test_a_roll_takes_one_replica_at_a_time_and_ends_when_all_serve_the_target():
    r, _ = rollout()
    started = r.begin("r0", "nvrm", "/b/b")
    assert started["state"] == "rolling" and r.join("r9") == {"nvrm": "/b/b", "mine": "/b/m"}
    assert r.begin("r1", "nvrm", "/b/c") is None  # one roll at a time
    assert r.claim("r1", {"nvrm": "/b/a", "mine": "/b/m"}) is None  # r0 (the PUT's replica) holds the turn
    r.done("r0", "nvrm", "/b/b", True, "rev-b")
    assert r.claim("r1", {"nvrm": "/b/a", "mine": "/b/m"}) == ("nvrm", "/b/b")
    assert r.claim("r2", {"nvrm": "/b/a", "mine": "/b/m"}) is None  # r1's turn
    assert r.status(started["id"])["state"] == "rolling"
    r.done("r1", "nvrm", "/b/b", True, "rev-b")
    assert r.claim("r2", {"nvrm": "/b/a", "mine": "/b/m"}) == ("nvrm", "/b/b")
    r.done("r2", "nvrm", "/b/b", True, "rev-b")
    state = r.status(started["id"])
    assert state["state"] == "done"
    assert [(t["replica"], t["ok"], t["revision"]) for t in state["turns"]] == [("r0", True, "rev-b"), ("r1", True, "rev-b"), ("r2", True, "rev-b")]
    turns = state["turns"]
    assert all(a["finished"] <= b["started"] for a, b in zip(turns, turns[1:]))  # never two at once
    assert r.begin("r2", "mine", "/b/m2") is not None  # the next roll may start


def test_a_refusal_on_the_first_replica_changes_nothing():
    r, _ = rollout()
    started = r.begin("r1", "nvrm", "/b/bad")
    r.done("r1", "nvrm", "/b/bad", False, "fails verification")
    state = r.status(started["id"])
    assert state["state"] == "failed" and "fails verification" in state["error"]
    assert r.join("r9")["nvrm"] == "/b/a"
    assert all(r.claim(f"r{i}", {"nvrm": "/b/a", "mine": "/b/m"}) is None for i in range(3))


def test_a_replica_that_fails_mid_roll_rolls_the_others_back():
    r, _ = rollout()
    started = r.begin("r0", "nvrm", "/b/b")
    r.done("r0", "nvrm", "/b/b", True, "rev-b")
    assert r.claim("r1", {"nvrm": "/b/a", "mine": "/b/m"}) == ("nvrm", "/b/b")
    r.done("r1", "nvrm", "/b/b", False, "507: does not fit")
    assert r.status(started["id"])["state"] == "rolling back" and r.join("r9")["nvrm"] == "/b/a"
    assert r.claim("r2", {"nvrm": "/b/a", "mine": "/b/m"}) is None  # never went: nothing to undo
    assert r.claim("r0", {"nvrm": "/b/b", "mine": "/b/m"}) == ("nvrm", "/b/a")  # swaps back
    r.done("r0", "nvrm", "/b/a", True, "rev-a")
    state = r.status(started["id"])
    assert state["state"] == "failed" and state["error"] == "replica r1: 507: does not fit"


def test_a_replica_gone_quiet_does_not_hold_a_roll_forever():
    r, clock = rollout(2)
    started = r.begin("r0", "nvrm", "/b/b")
    r.done("r0", "nvrm", "/b/b", True, "rev-b")
    assert r.status(started["id"])["state"] == "rolling"  # r1 still on /b/a
    clock.t += STALE_S + 1  # r1 died (Ray Serve replaces it; the new one joins at /b/b)
    r.claim("r0", {"nvrm": "/b/b", "mine": "/b/m"})
    assert r.status(started["id"])["state"] == "done"
