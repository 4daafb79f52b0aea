"""Every Python and shell snippet in README.md and docs/ runs as written, or says why it cannot; and the
documentation site builds with ``mkdocs build --strict`` (issue 32, item 6).

A snippet is a fenced block in python, bash, sh, shell or console. The line before it must be
``<!-- run: NAME -->`` or ``<!-- not run: REASON -->``. Runnable snippets run in one folder holding
``artifacts/WORL-NVRM`` (a release-layout tiny bundle with a guard), ``context.mp4``, ``candidate.mp4``,
``candidate_b.mp4``, ``manifest.jsonl`` and ``pairs.jsonl``, in the order they appear in their page
(a page's later snippet may use what an earlier one wrote); each page runs in a copy of that folder of its own,
two pages at a time. ``server/NAME`` snippets, the README's
``client-quickstart`` among them, run while the README's ``serve-quickstart`` server is up (its port
swapped for a free one). Names in ``DEDICATED`` run in a test file of their own.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import free_port

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL, PYTHON = {"bash", "sh", "shell", "console"}, {"python", "py"}
MARKER = re.compile(r"^<!-- (run|not run): (.+?) -->$")
DEDICATED = {"preference-recipe": "tests/e2e/test_recipe.py"}
SERVER = ("serve-quickstart", "client-quickstart")
BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class Snippet:
    page: str
    line: int
    lang: str
    code: str
    kind: str | None
    """``run``, ``not run`` or None (unmarked)."""
    label: str

    @property
    def name(self) -> str:
        return self.label.split(" ", 1)[0]


def snippets() -> list[Snippet]:
    out = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        i = 0
        while i < len(lines):
            fence = re.match(r"^```(\w*)\s*$", lines[i])
            if not fence:
                i += 1
                continue
            j = next(k for k in range(i + 1, len(lines)) if lines[k].startswith("```"))
            if fence.group(1) in SHELL | PYTHON:
                before = next((lines[k].strip() for k in range(i - 1, -1, -1) if lines[k].strip()), "")
                m = MARKER.match(before)
                out.append(Snippet(page.relative_to(ROOT).as_posix(), i + 1, fence.group(1), "\n".join(lines[i + 1 : j]) + "\n",
                                   m.group(1) if m else None, m.group(2) if m else ""))
            i = j + 1
    return out


ALL = snippets()
RUN = [s for s in ALL if s.kind == "run" and s.name not in DEDICATED]
LOCAL = [s for s in RUN if not s.name.startswith("server/") and s.name not in SERVER]
WITH_SERVER = [s for s in RUN if s.name.startswith("server/") or s.name == "client-quickstart"]


def test_every_snippet_runs_or_says_why():
    unmarked = [f"{s.page}:{s.line}" for s in ALL if s.kind is None]
    assert not unmarked, f"snippets without <!-- run: NAME --> or <!-- not run: REASON -->: {unmarked}"
    vague = [f"{s.page}:{s.line}" for s in ALL if s.kind == "not run" and len(s.label) < 20]
    assert not vague, f"say why these cannot run: {vague}"
    names = [s.name for s in ALL if s.kind == "run"]
    assert len(names) == len(set(names)), f"snippet names repeat: {sorted(n for n in names if names.count(n) > 1)}"
    for name, test in DEDICATED.items():
        assert name in names and name in (ROOT / test).read_text(), f"{name} should run in {test}"
    assert {"serve-quickstart", "client-quickstart", "python-quickstart", "cli-quickstart"} <= set(names)
    ran = len(RUN) + len(DEDICATED)
    assert ran >= len([s for s in ALL if s.kind == "not run"]), "most snippets should run"


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory, tiny_bundle, clips):
    from helpers import guarded_copy

    d = tmp_path_factory.mktemp("docs-sandbox")
    (d / "artifacts").mkdir()
    guarded_copy(tiny_bundle, d / "artifacts" / "WORL-NVRM")  # with a guard, as after nvrm guard fit (docs/hacking.md)
    for name, clip in (("context", "context"), ("candidate", "cand_a"), ("candidate_b", "cand_b")):
        shutil.copy(clips[clip], d / f"{name}.mp4")
    rows = [{"id": "g", "prompt": "A person walks.", "context": "context.mp4", "candidates": ["candidate.mp4", "candidate_b.mp4"]},
            {"id": "s", "prompt": "A person walks.", "context": "context.mp4", "candidate": "candidate_b.mp4"}]
    (d / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "pairs.jsonl").write_text(
        json.dumps({"prompt": "A person walks.", "context": "context.mp4", "chosen": "candidate.mp4", "rejected": "candidate_b.mp4"}) + "\n"
    )
    return d


def env() -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "NO_MKDOCS_2_WARNING": "1"}


def run_snippet(s: Snippet, cwd: Path, port: int | None = None) -> subprocess.CompletedProcess:
    code = s.code if port is None else s.code.replace("8000", str(port))
    cmd = ["bash", "-euo", "pipefail", "-c", code] if s.lang in SHELL else [sys.executable, "-c", code]
    return subprocess.run(cmd, cwd=cwd, env=env(), capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def local_runs(sandbox, tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """Every local snippet run: each page in a copy of the sandbox of its own, its snippets in order; two pages at
    a time (a snippet is mostly one process starting, single-threaded, so two share these 2 cores well)."""
    pages: dict[str, list[Snippet]] = {}
    for s in LOCAL:
        pages.setdefault(s.page, []).append(s)
    root = tmp_path_factory.mktemp("docs-pages")

    def run_page(page: str) -> dict[str, subprocess.CompletedProcess]:
        folder = root / page.replace("/", "_")
        shutil.copytree(sandbox, folder)
        return {s.name: run_snippet(s, folder) for s in pages[page]}

    with ThreadPoolExecutor(2) as pool:
        return {name: done for ran in pool.map(run_page, sorted(pages, key=lambda p: -len(pages[p]))) for name, done in ran.items()}


@pytest.mark.parametrize("snippet", LOCAL, ids=[s.name for s in LOCAL])
def test_snippet_runs(snippet, local_runs):
    done = local_runs[snippet.name]
    assert done.returncode == 0, f"{snippet.page}:{snippet.line} ({snippet.name}) failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr


def test_server_snippets_run_against_the_quickstart_server(sandbox):
    [start] = [s for s in ALL if s.name == "serve-quickstart"]
    port = free_port()
    command = start.code.replace("8000", str(port)).strip()
    assert command.endswith("&"), "the quickstart starts the server in the background"
    server = subprocess.Popen(["bash", "-c", command[:-1]], cwd=sandbox, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, start_new_session=True)
    try:
        for s in WITH_SERVER:
            done = run_snippet(s, sandbox, port)
            assert done.returncode == 0, f"{s.page}:{s.line} ({s.name}) failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
            assert done.stdout.strip(), f"{s.name} printed nothing"
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    assert len(WITH_SERVER) >= 3


def test_the_documentation_site_builds_strictly(tmp_path):
    t0 = time.monotonic()
    done = subprocess.run([str(BIN / "mkdocs"), "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT, env=env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert (tmp_path / "site" / "preference-data" / "index.html").is_file() and time.monotonic() - t0 < 300


def _subparsers(parser) -> dict:
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return {}


def _flags_of(parser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings}


def documented_commands(code: str) -> list[tuple[list[str], list[str]]]:
    """Each ``nvrm`` command line in a snippet: (its subcommand path, the ``--flags`` it writes). Continued
    lines (a trailing backslash) are joined; text after a ``#`` is a comment."""
    joined = re.sub(r"\\\n", " ", code)
    out = []
    for line in joined.splitlines():
        line = line.split(" # ", 1)[0]
        for part in re.split(r"[|;&]{1,2}|\$\(", line):
            words = part.replace("[", " ").replace("]", " ").split()
            while words and (words[0] in ("sudo", "time", "exec") or "=" in words[0]):
                words = words[1:]
            if not words or Path(words[0]).name != "nvrm":
                continue
            path = [w for w in words[1:3] if re.fullmatch(r"[a-z][a-z-]*", w)]
            flags = [w.split("=", 1)[0] for w in words if re.fullmatch(r"--[a-z0-9][a-z0-9-]*(=.*)?", w)]
            out.append((path, flags))
    return out


def test_every_documented_flag_exists_in_the_parser():
    """Every ``--flag`` written after ``nvrm SUBCOMMAND`` in any snippet, run or not run, is one the real parser
    has (a ``not run`` synopsis can otherwise drift from the code unseen)."""
    from nvrm.cli.main import build_parser

    root = build_parser()
    wrong, seen = [], 0
    for s in ALL:
        if s.lang not in SHELL:
            continue
        for path, flags in documented_commands(s.code):
            parser, subs = root, _subparsers(root)
            for word in path:
                if word not in subs:
                    break
                parser, subs = subs[word], _subparsers(subs[word])
            if parser is root:
                wrong.append(f"{s.page}:{s.line}: nvrm {' '.join(path)}: no such command")
                continue
            known = _flags_of(parser)
            seen += len(flags)
            wrong += [f"{s.page}:{s.line}: nvrm {' '.join(path)} has no {f}" for f in flags if f not in known and f != "--help"]
    assert not wrong, "documented flags the parser does not have:\n" + "\n".join(wrong)
    assert seen > 50, seen  # the check read the docs' command lines
