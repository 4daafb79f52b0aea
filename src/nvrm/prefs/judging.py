"""``nvrm prefs judge``: every pair asked of every judge in both presentation orders, into a resumable journal.

The pairs file is what ``nvrm prefs pairs`` writes (``pair_id``, ``prompt``, ``context``, ``a``, ``b``).
Each pair becomes two judgments per judge: order ``ab`` (a shown first) and ``ba``. A judgment is
keyed by (pair_id, order, judge, rubric sha256); the output file is its journal (one JSON row per
judgment, appended and fsynced as it is made, locked while a run writes it), so a run killed at any
point and started again with ``--resume`` asks only what is missing, and writes nothing twice.

Each row is the ``nvrm prefs filter`` judgment format (``prompt``, ``context``, ``first``, ``second``,
``winner``) plus its provenance: ``judge``, ``judge_model``, ``template_sha256``, ``judge_contract``,
``raw`` (the answer as given, its first 4,096 characters; ``raw_chars`` its length), ``unparsed`` (why it was
not read as a verdict: its ``winner`` is then null, never guessed), ``error`` (a final failure: a missing
video, a 4xx, an answer of the wrong shape or over ``--max-answer-kb``), ``confidence``, ``usage`` (whole,
non-negative token counts, else null).
Failures that may pass (429 and 5xx after every retry, timeouts, an unreachable server, the
deadline) are not written: the run says how many and exits 1, and ``--resume`` asks them again.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from .._fields import meta
from ..errors import ConfigError, InputError, NvrmError
from .judge_contract import JudgeContract, Rubric, video_images
from .judge_answers import clean_usage
from .judges import Answer, ChatJudge, RewardJudge
from .verdict import agreement, confidence_from_logprobs, parse_verdict

ORDERS = ("ab", "ba")
RAW_EXCERPT = 4096
"""The most characters of an answer a row keeps as ``raw`` (``raw_chars`` says how long it was)."""


@dataclass(frozen=True)
class PairToJudge:
    pair_id: str
    prompt: str
    context: str
    a: str
    b: str


@dataclass(frozen=True)
class Task:
    """One judgment to make."""

    pair: PairToJudge
    order: str
    judge: str

    @property
    def shown(self) -> tuple[str, str]:
        """(first, second) as presented."""
        return (self.pair.a, self.pair.b) if self.order == "ab" else (self.pair.b, self.pair.a)


def read_pairs_to_judge(path: str | Path) -> tuple[list[PairToJudge], list[str]]:
    """(pairs, one message per unusable line) of a pairs file written by ``nvrm prefs pairs``."""
    from ..video.paths import resolve_path

    path = Path(path)
    try:
        lines = path.read_bytes().decode("utf-8", errors="replace").splitlines()
    except OSError as e:
        raise InputError(str(path), f"cannot read the pairs file ({e.strerror})") from e
    out, problems, seen = [], [], set()
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            try:
                obj = json.loads(line)
            except RecursionError:
                raise ValueError("JSON nested too deeply") from None
            if not isinstance(obj, dict):
                raise ValueError("not a JSON object")
            pid = obj.get("pair_id")
            if not isinstance(pid, str) or not pid:
                raise ValueError("'pair_id' must be a non-empty string")
            if pid in seen:
                raise ValueError(f"pair_id {pid!r} appears twice")
            if not isinstance(obj.get("prompt"), str) or not obj["prompt"].strip():
                raise ValueError("'prompt' must be non-empty text")
            a, b = (resolve_path(path.parent, obj.get(k), f"'{k}'") for k in ("a", "b"))
            if a == b:
                raise ValueError("'a' and 'b' are the same video")
            seen.add(pid)
            out.append(PairToJudge(pid, obj["prompt"], resolve_path(path.parent, obj.get("context"), "'context'"), a, b))
        except ValueError as e:
            problems.append(f"{path}: line {n}: {e}")
    return out, problems


def plan(pairs: Iterable[PairToJudge], judges: Iterable[str], done: set[tuple[str, str, str]]) -> list[Task]:
    """The judgments not yet in the journal, pair by pair (pure)."""
    names = list(judges)
    return [Task(p, o, j) for p in pairs for j in names for o in ORDERS if (p.pair_id, o, j) not in done]


@dataclass
class Tally:
    """What a run did, for its summary."""

    written: int = 0
    verdicts: int = 0
    unparsed: int = 0
    failed: int = 0
    """Rows written with a final error."""
    not_made: int = 0
    """Transient failures and the deadline: not written, asked again by --resume."""
    reasons: dict[str, int] = field(default_factory=dict)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    unreported_usage: int = 0
    max_in_flight: dict[str, int] = field(default_factory=dict)

    def not_made_because(self, reason: str) -> None:
        self.not_made += 1
        self.reasons[reason] = self.reasons.get(reason, 0) + 1


@dataclass(frozen=True)
class RunSettings:
    """How ``nvrm prefs judge`` asks (its flags are generated from these fields)."""

    concurrency: int = field(default=4, metadata=meta("requests in flight per judge, after its first, which goes alone"))
    timeout_s: float = field(default=120.0, metadata=meta("per-request timeout in seconds"))
    retries: int = field(default=4, metadata=meta("retries of a request after 429, 5xx, a timeout or a dropped connection (with backoff)"))
    deadline_s: float | None = field(default=None, metadata=meta("stop asking after this many seconds; what is not made is asked again by --resume"))
    api_key_env: str | None = field(default=None, metadata=meta("environment variable holding the API key of judges that name none (key_env=...)"))
    structured: str = field(default="auto", metadata=meta("ask for a JSON-schema verdict: auto (unless the server refuses it), json_schema, "
                                                          "or none (the strict parser alone)",
                                                          choices=("auto", "json_schema", "none")))
    logprobs: bool = field(default=False, metadata=meta("ask for the answer tokens' log-probabilities "
                                                        "(a confidence per verdict, where the server returns them)"))
    max_tokens: int = field(default=64, metadata=meta("the most tokens a judge may answer with"))
    max_answer_kb: int = field(default=1024, metadata=meta("the most kilobytes of an answer read, after decompression (a gzip bomb stops there); "
                                                           "a larger answer fails its row"))
    price_in: float | None = field(default=None, metadata=meta("cost per million prompt tokens (the summary's cost)"))
    price_out: float | None = field(default=None, metadata=meta("cost per million completion tokens"))

    def __post_init__(self) -> None:
        checks = {"concurrency": 1 <= self.concurrency <= 1024, "timeout_s": self.timeout_s > 0, "retries": 0 <= self.retries <= 100,
                  "deadline_s": self.deadline_s is None or self.deadline_s > 0, "max_tokens": 1 <= self.max_tokens <= 65536,
                  "max_answer_kb": 1 <= self.max_answer_kb <= 1 << 20,
                  "price_in": self.price_in is None or self.price_in >= 0, "price_out": self.price_out is None or self.price_out >= 0}
        bad = [f"--{k.replace('_', '-')} {getattr(self, k)}" for k, ok in checks.items() if not ok]
        if bad:
            raise ConfigError(f"{', '.join(bad)}: out of range (see nvrm prefs judge --help)")


class JudgingRun:
    """Asks the planned judgments with bounded concurrency and writes each one as it is made."""

    def __init__(self, judges: dict[str, ChatJudge | RewardJudge], rubric: Rubric, contract: JudgeContract, journal, settings: RunSettings):
        self.judges = judges
        self.rubric = rubric
        self.contract = contract
        self.journal = journal
        self.settings = settings
        self.tally = Tally()
        self._images: dict[tuple[str, str], asyncio.Future] = {}
        self._in_flight: dict[str, int] = {}

    async def images(self, path: str, role: str) -> list[str]:
        """The judge contract's images of one video, decoded once per run (in a thread)."""
        key = (path, role)
        if key not in self._images:
            self._images[key] = asyncio.ensure_future(asyncio.to_thread(video_images, path, role, self.contract))
        return await asyncio.shield(self._images[key])

    async def run(self, tasks: list[Task]) -> Tally:
        gates = {name: asyncio.Semaphore(self.settings.concurrency) for name in self.judges}
        pending = [asyncio.ensure_future(self.one(t, gates[t.judge])) for t in tasks]
        if pending:
            done, left = await asyncio.wait(pending, timeout=self.settings.deadline_s)
            for f in left:
                f.cancel()
            for f in left:
                self.tally.not_made_because(f"the --deadline-s of {self.settings.deadline_s:g} s passed")
            await asyncio.gather(*left, return_exceptions=True)
            for f in done:
                f.result()  # a bug or a write failure surfaces here
        for judge in self.judges.values():
            await judge.close()
        return self.tally

    async def one(self, task: Task, gate: asyncio.Semaphore) -> None:
        first, second = task.shown
        judge = self.judges[task.judge]
        async with gate:
            self._in_flight[task.judge] = self._in_flight.get(task.judge, 0) + 1
            self.tally.max_in_flight[task.judge] = max(self.tally.max_in_flight.get(task.judge, 0), self._in_flight[task.judge])
            started = time.time()
            try:
                answer = await self.ask(judge, task, first, second)
            finally:
                self._in_flight[task.judge] -= 1
        if answer.transient:
            self.tally.not_made_because(answer.error or "a transient failure")
            return
        self.write(task, answer, started)

    async def ask(self, judge: ChatJudge | RewardJudge, task: Task, first: str, second: str) -> Answer:
        if isinstance(judge, RewardJudge):
            return await judge.compare(task.pair.prompt, task.pair.context, first, second)
        try:
            shown = {"first": await self.images(first, "candidate"), "second": await self.images(second, "candidate")}
            if self.contract.max_context_frames:
                shown["context"] = await self.images(task.pair.context, "context")
        except NvrmError as e:
            return Answer(error=str(e))
        except Exception as e:  # noqa: BLE001 - a video that does not decode fails its row, not the run
            return Answer(error=f"{type(e).__name__}: {e}")
        return await judge.ask(self.rubric.content(task.pair.prompt, shown))

    def write(self, task: Task, answer: Answer, started: float) -> None:
        first, second = task.shown
        judge = self.judges[task.judge]
        verdict = parse_verdict(answer.text) if answer.error is None else None
        confidence = None
        if verdict is not None and verdict.winner:  # nvrm's own judge says how sure it is; a chat judge's logprobs do
            confidence = answer.confidence if isinstance(judge, RewardJudge) else confidence_from_logprobs(answer.logprobs, verdict.winner)
        usage = clean_usage(answer.usage)
        row = {
            "pair_id": task.pair.pair_id, "order": task.order, "judge": task.judge,
            "judge_model": judge.spec.model if judge.spec.kind == "chat" else (judge.spec.path or judge.spec.url),
            "prompt": task.pair.prompt, "context": task.pair.context, "first": first, "second": second,
            "winner": verdict.winner if verdict else None, "unparsed": verdict.reason if verdict and not verdict.winner else None,
            "error": answer.error, "raw": None if answer.text is None else answer.text[:RAW_EXCERPT],
            "raw_chars": None if answer.text is None else len(answer.text), "confidence": confidence, "usage": usage or None,
            "template_sha256": self.rubric.sha256, "judge_contract": self.contract.fingerprint,
            "attempts": answer.attempts, "seconds": round(answer.seconds, 4), "started_at": round(started, 3),
        }
        self.journal.append([row])
        t = self.tally
        t.written += 1
        t.failed += answer.error is not None
        t.verdicts += bool(verdict and verdict.winner)
        t.unparsed += bool(verdict and not verdict.winner)
        if usage:  # whole, non-negative counts only (clean_usage)
            t.prompt_tokens += usage["prompt_tokens"]
            t.completion_tokens += usage.get("completion_tokens", 0)
        elif judge.spec.kind == "chat" and answer.error is None:
            t.unreported_usage += 1


def journal_check(judges: dict[str, Any], rubric: Rubric, contract: JudgeContract):
    """A row check for the journal: refuses rows another rubric or judge contract made for one of these judges."""

    def check(n: int, row: Any) -> str | None:
        if not isinstance(row, dict) or not {"pair_id", "order", "judge"} <= set(row):
            return "is not an nvrm prefs judge row (needs pair_id, order and judge)"
        if row["judge"] in judges and row.get("template_sha256") != rubric.sha256:
            return (f"was judged by {row['judge']} with another rubric (sha256 {str(row.get('template_sha256'))[:12]}, this run's is {rubric.sha256[:12]}); "
                    "resume with the same rubric or write a new file")
        if row["judge"] in judges and row.get("judge_contract") != contract.fingerprint:
            return "was judged under another judge contract (frames, sizes, encoding); resume with the same settings or write a new file"
        return None

    return check


def summary(tally: Tally, rows: list[dict], settings: RunSettings, seconds: float) -> dict[str, Any]:
    """The run's numbers, plus per-judge and cross-judge agreement over every row of the journal."""
    cost = None
    if settings.price_in is not None or settings.price_out is not None:
        cost = tally.prompt_tokens * (settings.price_in or 0) / 1e6 + tally.completion_tokens * (settings.price_out or 0) / 1e6
    return {
        "written": tally.written, "verdicts": tally.verdicts, "unparsed": tally.unparsed, "failed": tally.failed,
        "not_made": tally.not_made, "not_made_reasons": tally.reasons, "rows_in_output": len(rows), "seconds": round(seconds, 2),
        "tokens": {"prompt": tally.prompt_tokens, "completion": tally.completion_tokens, "answers_without_usage": tally.unreported_usage},
        "cost": cost, "max_in_flight": tally.max_in_flight, "agreement": agreement(rows),
    }
