"""The README's Python snippet runs as written (paths swapped for test files)."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_python_snippet_runs(tiny_bundle, clips, capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README has no python snippet"
    code = blocks[0]
    code = code.replace('"artifacts/WORL-NVRM"', repr(str(tiny_bundle)))
    code = code.replace('"context.mp4"', repr(str(clips["context"]))).replace('"candidate.mp4"', repr(str(clips["cand_a"])))
    exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and out[0].split()[0].replace(".", "").lstrip("-").isdigit()
