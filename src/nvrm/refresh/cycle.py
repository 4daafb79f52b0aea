"""One refresh cycle on disk: record -> pairs -> judge -> filter -> split -> train -> gate -> export.

``run_cycle`` walks the stages of ``plan.STAGES`` in a cycle folder. Each stage writes into its own
sub-folder and, once finished, its ``done.json`` (``plan``): a killed cycle started again skips the
stages done with the same inputs and redoes the rest. Within a stage, judging continues its journal
(``nvrm prefs judge``'s resume) and training continues from its latest checkpoint.

    result = run_cycle("rec/", "bundle/", "cycles/1", ["http://127.0.0.1:8000/v1"])
    result.passed, result.export        # the gate's verdict; the exported bundle (None when it failed)
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from .._fields import meta
from ..errors import ConfigError, InputError
from . import plan as P
from .cycle_stages import bundle_digest

STRATEGIES = ("least-certain", "all", "active")


@dataclass(frozen=True)
class RefreshConfig:
    """How ``nvrm refresh`` runs one cycle (its flags are generated from these fields)."""

    strategy: str = field(default="least-certain", metadata=meta("which pairs to judge: the least certain of each request group "
                                                                   "(smallest recorded reward gap), all, or active: the most informative "
                                                                   "over the whole record, by the recorded uncertainty (the guard) and the "
                                                                   "Bradley-Terry closeness (docs/refresh.md)", choices=STRATEGIES))
    pairs_per_cycle: int = field(default=256, metadata=meta("the most pairs judged in one cycle (--strategy active: its judge budget)"))
    holdout: float = field(default=0.2, metadata=meta("fraction of the judged pairs (whole contexts) kept out of training for the gate"))
    require_judges: int = field(default=1, metadata=meta("keep a pair only when at least N judges judged it in both orders"))
    max_anchor_drop: float = field(default=0.02, metadata=meta("the most the accuracy on --anchor-pairs may drop (0.02: two points)"))
    probe_contexts: int = field(default=8, metadata=meta("record contexts the gate probes (nvrm probe on each one's best-rewarded candidate; "
                                                         "held-out contexts first); 0: no probe check"))
    probe_perturbations: str = field(default="", metadata=meta("comma-separated perturbations the gate probes (default: all; nvrm probe --list)"))
    probe_flag_share: float = field(default=0.5, metadata=meta("a perturbation is flagged for a model when it raised the reward on more than "
                                                               "this share of the probed clips"))

    def __post_init__(self) -> None:
        checks = {"strategy": self.strategy in STRATEGIES, "pairs_per_cycle": self.pairs_per_cycle >= 1, "holdout": 0 < self.holdout < 1,
                  "require_judges": self.require_judges >= 1, "max_anchor_drop": 0 <= self.max_anchor_drop <= 1,
                  "probe_contexts": self.probe_contexts >= 0, "probe_flag_share": 0 <= self.probe_flag_share < 1}
        bad = [f"--{k.replace('_', '-')} {getattr(self, k)}" for k, ok in checks.items() if not ok]
        if bad:
            raise ConfigError(f"{', '.join(bad)}: out of range (see nvrm refresh --help)")
        from ..probe.perturbations import PERTURBATIONS

        unknown = [n.strip() for n in self.probe_perturbations.split(",") if n.strip() and n.strip() not in PERTURBATIONS]
        if unknown:
            raise ConfigError(f"--probe-perturbations {self.probe_perturbations}: unknown {', '.join(unknown)} (see nvrm probe --list)")


@dataclass(frozen=True)
class CycleResult:
    """What one ``run_cycle`` did."""

    folder: str
    passed: bool
    """the gate's verdict"""
    report: dict[str, Any]
    """the gate's report (also ``FOLDER/gate/gate.json``)"""
    export: str | None
    """the exported bundle (None: the gate failed, nothing exported)"""
    ran: tuple[str, ...]
    """the stages run this time (the others were done already)"""
    failure: str | None = None
    """one line: why the gate failed"""
    swap: dict[str, Any] | None = None
    """with ``serve=``: the swap into the running server (``FOLDER/export/swap.json``: model, previous and new revision)"""


@dataclass
class Cycle:
    """The cycle's inputs and folder (each stage of ``cycle_stages`` reads them)."""

    record: Path
    base: Path
    root: Path
    judges: tuple[str, ...]
    config: RefreshConfig
    train: Any
    judging: Any
    contract: Any
    rubric: Any
    anchor_pairs: Path | None
    export_to: Path | None
    device: str | None
    say: Callable[[str], None]

    def settings(self) -> dict[str, dict[str, Any]]:
        """What each stage's fingerprint covers besides the stage before it."""
        c = self.config
        anchors = P.digest(self.anchor_pairs.read_text(errors="replace")) if self.anchor_pairs else None
        return {
            "record": {"record": str(self.record.resolve())},
            "pairs": {"strategy": c.strategy, "pairs_per_cycle": c.pairs_per_cycle},
            "judge": {"judges": list(self.judges), "rubric": self.rubric.sha256, "contract": self.contract.fingerprint},
            "filter": {"require_judges": c.require_judges},
            "split": {"holdout": c.holdout},
            "train": {"base": bundle_digest(self.base), "config": self.train.to_dict(), "device": self.device},
            "gate": {"anchor_pairs": anchors, "max_anchor_drop": c.max_anchor_drop, "base": bundle_digest(self.base),
                     "probe": [c.probe_contexts, c.probe_perturbations, c.probe_flag_share]},
            "export": {"to": str(self.export_to) if self.export_to else None},
        }


def read_marker(folder: Path) -> dict[str, Any] | None:
    """A stage's ``done.json`` (None: absent or unreadable, so the stage runs)."""
    try:
        obj = json.loads((folder / P.DONE).read_text())
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def _write_marker(folder: Path, stage: str, fp: str, output: str) -> None:
    tmp = folder / (P.DONE + ".tmp")
    tmp.write_text(json.dumps({"stage": stage, "fingerprint": fp, "output": output}) + "\n")
    tmp.replace(folder / P.DONE)  # atomic: a stage is done or it is not


def run_cycle(record: str | Path, base: str | Path, folder: str | Path, judges: Sequence[str], *, config: RefreshConfig = RefreshConfig(),
              train: Any = None, judging: Any = None, judge_contract: Any = None, rubric: str | Path | None = None,
              anchor_pairs: str | Path | None = None, export: str | Path | None = None, device: str | None = None,
              say: Callable[[str], None] | None = None, serve: str | None = None, serve_model: str | None = None,
              admin_key_env: str = "NVRM_ADMIN_KEY", serve_key_env: str | None = None) -> CycleResult:
    """Run (or resume) one refresh cycle in ``folder``: judge pairs from the ``record``, train a LoRA from ``base``
    (``train``: a ``TrainConfig``), gate it and export it (to ``export``, default ``FOLDER/export/bundle``) when it passes;
    with ``serve`` (a running ``nvrm serve``'s URL), swap the export in as ``serve_model`` (``swap``)."""
    from ..prefs.judge_contract import JudgeContract, Rubric
    from ..prefs.judging import RunSettings
    from ..train.config import TrainConfig
    from .cycle_stages import RUN

    if not judges:
        raise ConfigError("--judge: name at least one judge (as nvrm prefs judge takes them)")
    cycle = Cycle(Path(record), Path(base), Path(folder), tuple(judges), config, train or TrainConfig(), judging or RunSettings(),
                  judge_contract or JudgeContract(), Rubric.load(rubric), Path(anchor_pairs) if anchor_pairs else None,
                  Path(export) if export else None, device, say or (lambda line: print(line, file=sys.stderr)))
    if serve:
        import os

        if not os.environ.get(admin_key_env):  # checked before the cycle's work, not after it
            raise ConfigError(f"--admin-key-env {admin_key_env}: the environment variable is not set; --serve needs the server's admin key in it")
    if cycle.anchor_pairs and not cycle.anchor_pairs.is_file():
        raise InputError(str(cycle.anchor_pairs), "anchor pairs file not found (--anchor-pairs)")
    cycle.root.mkdir(parents=True, exist_ok=True)
    settings = cycle.settings()
    upstream: str | None = None
    ran: list[str] = []
    for stage in P.STAGES:
        sub = cycle.root / stage
        marker = read_marker(sub)
        step = P.decide(stage, P.fingerprint(stage, settings[stage], upstream), marker)
        if step.action == "skip" and marker is not None:
            cycle.say(f"nvrm refresh: {stage}: done already")
            upstream = str(marker["output"])
            continue
        (sub / P.DONE).unlink(missing_ok=True)
        if stage not in ("judge", "train") or _stale(sub, step.fingerprint):  # judging and training resume their own work
            shutil.rmtree(sub, ignore_errors=True)
        sub.mkdir(parents=True, exist_ok=True)
        (sub / "started.json").write_text(json.dumps({"fingerprint": step.fingerprint}) + "\n")
        cycle.say(f"nvrm refresh: {stage}: {step.reason}; running")
        ran.append(stage)
        output = RUN[stage](cycle, sub)
        if output is None:  # the gate failed: nothing is exported, and export is not marked done
            break
        _killpoint(stage)
        _write_marker(sub, stage, str(step.fingerprint), output)
        upstream = output
    report = json.loads((cycle.root / "gate" / "gate.json").read_text())
    done = read_marker(cycle.root / "export")
    exported = json.loads((cycle.root / "export" / "export.json").read_text())["bundle"] if done else None
    from .gate import failure_line

    swapped = None
    if serve and exported:
        from .swap import swap_once

        swapped, now = swap_once(cycle.root, exported, serve, model=serve_model, admin_key_env=admin_key_env, api_key_env=serve_key_env)
        cycle.say(f"nvrm refresh: serve: model {swapped['model']} at {serve}: "
                  f"{'swapped' if now else 'swapped already'} {swapped['previous_revision']} -> {swapped['revision']}")
    return CycleResult(str(cycle.root), bool(report["passed"]), report, exported, tuple(ran),
                       None if report["passed"] else failure_line(report), swapped)


KILL_AFTER = "NVRM_REFRESH_TEST_KILL_AFTER"
"""Tests only: comma-separated stage names; the cycle SIGKILLs itself once such a stage has written its output but
not yet its ``done.json`` (the worst moment), the first time only: it leaves ``STAGE.killed`` in the folder named by
``NVRM_REFRESH_TEST_KILL_AFTER_DIR`` and does not kill there again, so the cycle run again goes on."""


def _killpoint(stage: str) -> None:
    import os

    wanted = os.environ.get(KILL_AFTER)
    if not wanted or stage not in wanted.split(","):
        return
    flag = Path(os.environ.get(KILL_AFTER + "_DIR", ".")) / f"{stage}.killed"
    if flag.exists():
        return
    flag.write_text("")
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


def _stale(sub: Path, fp: str | None) -> bool:
    try:
        return json.loads((sub / "started.json").read_text()).get("fingerprint") != fp
    except (OSError, ValueError):
        return True

