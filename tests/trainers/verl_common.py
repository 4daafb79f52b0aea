"""What the verl call-site scripts share (they run inside verl's environment, not nvrm's): a character
tokenizer, a render hook that maps the policy's one-letter answer to a candidate video, and verl's
``DataProto`` built the way its rollout builds it."""

import json
import os

import numpy as np
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

VOCAB = {"<pad>": 0, "<unk>": 1, "a": 2, "b": 3, "q": 4}
PROMPT = "A square glides across a tiled floor."


def tokenizer() -> PreTrainedTokenizerFast:
    tk = Tokenizer(models.WordLevel(vocab=VOCAB, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", unk_token="<unk>")


def write_render_hook(folder: str, cand_a: str, cand_b: str) -> str:
    """``render_hook:render`` in ``folder``: 'a' -> cand_a, 'b' -> cand_b; each call appends its process id,
    thread and keyword names to ``calls.jsonl`` there."""
    log = os.path.join(folder, "calls.jsonl")
    with open(os.path.join(folder, "render_hook.py"), "w") as f:
        f.write(
            "import json, os, threading\n"
            "def render(prompt, solution, **info):\n"
            f"    with open({log!r}, 'a') as f:\n"
            "        f.write(json.dumps({'pid': os.getpid(), 'thread': threading.current_thread().name, 'keys': sorted(info)}) + '\\n')\n"
            f"    return {{'a': {cand_a!r}, 'b': {cand_b!r}}}[solution.strip()]\n"
        )
    return log


def calls(log: str) -> list:
    return [json.loads(line) for line in open(log)] if os.path.exists(log) else []


def data(letters, infos):
    """A batch as verl's rollout hands it to reward managers: 2 prompt tokens, 1 answer token + 1 pad."""
    from verl import DataProto

    n = len(letters)
    prompts = torch.full((n, 2), VOCAB["q"])
    responses = torch.tensor([[VOCAB[c], 0] for c in letters])
    mask = torch.cat([torch.ones(n, 2, dtype=torch.long), torch.tensor([[1, 0]] * n)], dim=1)
    return DataProto.from_dict(
        tensors={"prompts": prompts, "responses": responses, "attention_mask": mask},
        non_tensors={
            "data_source": np.array(["video"] * n, dtype=object),
            "reward_model": np.array([{"ground_truth": None}] * n, dtype=object),
            "extra_info": np.array(infos, dtype=object),
        },
    )


def emit(**fields) -> None:
    print(json.dumps(fields))

