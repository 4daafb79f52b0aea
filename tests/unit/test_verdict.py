"""The judge's verdict logic on recorded answers: strict parsing (never a guessed winner), confidence from
log-probabilities, order consistency and agreement between judges; the rubric template and the judge
contract; the pairs a rollout yields (issue 31)."""

from __future__ import annotations

import math

import pytest

from nvrm.errors import ConfigError, InputError
from nvrm.prefs.judge_contract import JudgeContract, Rubric
from nvrm.prefs.pairing import choose_pairs
from nvrm.prefs.verdict import agreement, confidence_from_logprobs, parse_verdict

# answers as judges gave them: vLLM with guided JSON, a hosted model in a fence, a terse model, and
# what transformers serve's random-weight Qwen3-VL said in tests/e2e/test_judge.py
PARSED = [
    ('{"winner": "first"}', "first"),
    ('{"winner":"second"}', "second"),
    ('```json\n{"winner": "tie"}\n```', "tie"),
    ("Second", "second"),
    ("tie.", "tie"),
    ('Both are smooth, but the first keeps the square on its path. {"winner": "first"}', "first"),
    ('{"winner": " First "}', "first"),
]
UNPARSED = [
    (" kit kit kit kit kit kit", "no JSON object"),
    ("מקובלמקובלמקובל", "no JSON object"),
    ('{"winner": "A"}', "'winner' is 'A'"),
    ('{"verdict": "first"}', "'winner' is None"),
    ('{"winner": "first"} or maybe {"winner": "second"}', "several different JSON objects"),
    ("I think the first one", "no JSON object"),
    ("", "no JSON object"),
    ('{"winner": "first"', "no JSON object"),
]


@pytest.mark.parametrize("text,winner", PARSED)
def test_verdicts_that_say_who_won_are_read(text, winner):
    v = parse_verdict(text)
    assert v.winner == winner and v.reason is None


@pytest.mark.parametrize("text,reason", UNPARSED)
def test_anything_else_is_unparsed_with_its_reason_never_a_winner(text, reason):
    v = parse_verdict(text)
    assert v.winner is None and reason in v.reason


def test_confidence_is_the_answer_token_renormalised_over_the_answers():
    logprobs = {"content": [
        {"token": '{"', "logprob": -0.01}, {"token": "winner", "logprob": -0.02}, {"token": '":"', "logprob": -0.01},
        {"token": "first", "logprob": math.log(0.6), "top_logprobs": [{"token": "first", "logprob": math.log(0.6)},
                                                                      {"token": "second", "logprob": math.log(0.2)},
                                                                      {"token": "banana", "logprob": math.log(0.2)}]},
    ]}
    assert confidence_from_logprobs(logprobs, "first") == pytest.approx(0.75)
    alone = {"content": [{"token": "second", "logprob": math.log(0.9)}]}
    assert confidence_from_logprobs(alone, "second") == pytest.approx(0.9)
    assert confidence_from_logprobs(None, "first") is None and confidence_from_logprobs(logprobs, None) is None


def row(judge, pair, order, winner):
    first, second = ("a", "b") if order == "ab" else ("b", "a")
    return {"judge": judge, "pair_id": pair, "order": order, "first": f"{pair}/{first}", "second": f"{pair}/{second}", "winner": winner}


def test_order_consistency_and_agreement_between_judges():
    rows = [
        row("j1", "p1", "ab", "first"), row("j1", "p1", "ba", "second"),   # j1: a both times
        row("j1", "p2", "ab", "first"), row("j1", "p2", "ba", "first"),    # j1: position bias, inconsistent
        row("j1", "p3", "ab", "tie"), row("j1", "p3", "ba", "tie"),
        row("j2", "p1", "ab", "second"), row("j2", "p1", "ba", "first"),   # j2: b both times
        row("j2", "p3", "ab", "tie"), row("j2", "p3", "ba", "tie"),
        row("j2", "p4", "ab", "first"), row("j2", "p4", "ba", None),       # one unparsed order: not counted
        row("j3", "p1", "ab", None),
    ]
    a = agreement(rows)
    assert a["per_judge"]["j1"] == {"pairs_both_orders": 3, "order_consistency": pytest.approx(2 / 3)}
    assert a["per_judge"]["j2"] == {"pairs_both_orders": 2, "order_consistency": 1.0}
    assert a["per_judge"]["j3"] == {"pairs_both_orders": 0, "order_consistency": None}
    assert a["cross_judge"]["j1|j2"] == {"pairs": 2, "agreement": 0.5}  # p1 disagrees, p3 agrees (tie)
    assert a["cross_judge"]["j1|j3"] == {"pairs": 0, "agreement": None}


def test_rubric_templates_need_their_placeholders(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("Compare {first} and {secnd} under {prompt}.")
    with pytest.raises(InputError, match=r"lacks \{second\} and has unknown placeholder\(s\) \{secnd\}"):
        Rubric.load(bad)
    good = tmp_path / "good.txt"
    good.write_text('Prompt: {prompt}\nA: {first}\nB: {second}\nAnswer {"winner": ...}')
    rubric = Rubric.load(good)
    parts = rubric.content("a cat", {"first": ["data:1", "data:2"], "second": ["data:3"], "context": ["data:0"]})
    assert [p["type"] for p in parts] == ["text", "image_url", "image_url", "text", "image_url", "text"]
    assert parts[0]["text"] == "Prompt: a cat\nA: " and parts[-1]["text"].endswith('Answer {"winner": ...}')
    assert rubric.sha256 != Rubric.load(None).sha256
    with pytest.raises(InputError, match="cannot read the rubric template"):
        Rubric.load(tmp_path / "missing.txt")


def test_the_judge_contract_is_fingerprinted_and_checked():
    assert JudgeContract().fingerprint == JudgeContract().fingerprint != JudgeContract(fps=1.0).fingerprint
    with pytest.raises(ConfigError, match="fps=0"):
        JudgeContract(fps=0)
    c = JudgeContract(fps=2.0, max_frames=4, context_seconds=1.0, max_context_frames=2)
    assert c.times(5.0, "candidate") == [0.0, 1.5, 3.0, 4.5]
    assert c.times(6.0, "context") == [5.0, 5.5]


def test_pairs_per_rollout():
    assert choose_pairs(3, "all") == [(0, 1), (0, 2), (1, 2)]
    assert choose_pairs(5, "k", k=3, seed=1, rollout_id="r") == choose_pairs(5, "k", k=3, seed=1, rollout_id="r")
    assert len({tuple(choose_pairs(5, "k", k=3, seed=s, rollout_id="r")) for s in range(10)}) > 1  # the seed draws
    assert len(choose_pairs(5, "k", k=30, seed=1, rollout_id="r")) == 10
    assert choose_pairs(4, "uncertain", k=2, rewards=[0.0, 0.1, 1.0, 1.05]) == [(0, 1), (2, 3)]
    with pytest.raises(InputError, match="needs k >= 1"):
        choose_pairs(4, "k", k=0)
