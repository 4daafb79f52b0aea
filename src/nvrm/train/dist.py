"""The processes of one training run: ranks, their devices, and the collectives they agree through.

``nvrm train`` runs unchanged alone, under ``torchrun`` and under ``accelerate launch``, on one
machine or several. ``Ranks.start`` builds the Accelerate state (``Accelerator(cpu=True)`` on the
CPU, where gloo carries the collectives: a plain ``Accelerator()`` there would leave every process
believing it is rank 0) and refuses, in one line, a launch that asked for several processes but
did not give them distinct ranks (``accelerate launch --cpu --num_processes 2`` starts one).

Every rank takes part in every collective in the same order whatever its data did, so a pair that
fails on one rank never leaves another waiting. Before the model is wrapped and again before the
first step, the ranks compare what they were given (``Ranks.agree``: the settings and base bundle,
then a digest of the pairs and the resumed position): ranks launched with different pairs files or
settings would otherwise train "together" on schedules that do not match; they stop, naming both.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ..errors import ConfigError


def launch_problem(env: dict[str, str]) -> str | None:
    """Why ``env`` (a process's environment) is a multi-process launch that did not start distinct ranks (pure)."""
    world = env.get("WORLD_SIZE")
    if world is None and "MASTER_ADDR" in env and "ACCELERATE_USE_CPU" in env:
        return (
            "accelerate launch was asked for more than one process but started this one alone (it does that with --cpu); "
            "on the CPU launch with ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes N, or use torchrun"
        )
    if world is not None and (not world.isdigit() or int(world) < 1):
        return f"WORLD_SIZE={world!r} is not a positive whole number"
    return None


def disagreement(seen: Sequence[dict[str, list[str]]]) -> str | None:
    """The first fact the ranks disagree on, as one line naming it, rank 0's value and the first other rank's (pure).

    ``seen`` holds every rank's facts in rank order, each a name -> [what is compared, what is shown]; None when
    every rank has the same."""
    for name in dict.fromkeys(k for facts in seen for k in facts):
        values = [facts.get(name) for facts in seen]
        compared = [None if v is None else v[0] for v in values]
        other = next((r for r, v in enumerate(compared) if v != compared[0]), None)
        if other is not None:
            shown = ["nothing (it is missing there)" if v is None else v[1] for v in values]
            return (f"the {len(seen)} ranks of this run disagree on {name}: rank 0 has {shown[0]}, rank {other} has {shown[other]}; "
                    "launch every rank with the same base bundle, pairs files and settings")
    return None


@dataclass
class Ranks:
    """This process's place in the run, and the run's collectives (no-ops alone)."""

    accelerator: Any
    rank: int
    world: int
    local_rank: int
    local_world: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def start(cls, device: str | None = None) -> "Ranks":
        """Join the run this process was launched into (or run alone); refuses a launch without distinct ranks."""
        problem = launch_problem(dict(os.environ))
        if problem:
            raise ConfigError(problem)
        from accelerate import Accelerator

        cpu = (device or "").startswith("cpu") or (device is None and not torch.cuda.is_available())
        if device is not None and not cpu and not device.startswith("cuda"):
            raise ConfigError(f"--device {device}: training runs on cpu or cuda")
        acc = Accelerator(cpu=cpu)
        world = int(os.environ.get("WORLD_SIZE", "1"))
        ranks = cls(acc, acc.process_index, acc.num_processes, acc.local_process_index,
                    int(os.environ.get("LOCAL_WORLD_SIZE", str(world))), torch.device(acc.device))
        if acc.num_processes != world:
            raise ConfigError(f"the launcher started {world} processes, but they formed a run of {acc.num_processes}; "
                              "check MASTER_ADDR / MASTER_PORT and the launcher's flags")
        if world > 1:
            seen = ranks.gather(ranks.rank, to_all=True)
            if sorted(seen) != list(range(world)):
                raise ConfigError(f"the {world} processes of this launch do not have distinct ranks ({seen}); "
                                  "launch with torchrun or accelerate launch --multi_gpu")
        return ranks

    # ------------------------------------------------------------ collectives

    def barrier(self) -> None:
        if self.world > 1:
            self.accelerator.wait_for_everyone()

    def sum(self, values: Sequence[float]) -> list[float]:
        """``values`` summed over every rank (float64 on the wire, so counts stay exact)."""
        if self.world == 1:
            return [float(v) for v in values]
        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self._wire())
        torch.distributed.all_reduce(t)
        return t.cpu().tolist()

    def gather(self, obj: Any, *, to_all: bool = False) -> list[Any] | None:
        """Every rank's ``obj`` in rank order: on rank 0 (or, ``to_all``, on every rank); None elsewhere."""
        if self.world == 1:
            return [obj]
        out: list[Any] = [None] * self.world
        torch.distributed.all_gather_object(out, obj)
        return out if (to_all or self.is_main) else None

    def share(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if self.world == 1:
            return obj
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def agree(self, facts: dict[str, list[str]]) -> None:
        """Refuse, on every rank and in one line (``ConfigError``), a run whose ranks disagree on any of ``facts``
        (name -> [what is compared, what is shown]); a no-op alone."""
        if self.world == 1:
            return
        problem = disagreement(self.gather(facts, to_all=True) or [])
        if problem:
            raise ConfigError(problem)

    def check_all(self, error: BaseException | None) -> None:
        """Every rank raises if any rank failed a step they all depend on: a rank its own error, the others
        one naming the first rank that failed and why."""
        messages = self.gather(None if error is None else str(error), to_all=True) or [None]
        if error is not None:
            raise error
        failed = [(r, m) for r, m in enumerate(messages) if m is not None]
        if failed:
            raise ConfigError(f"rank {failed[0][0]} stopped: {failed[0][1]}")

    def _wire(self) -> torch.device:
        backend = torch.distributed.get_backend() if torch.distributed.is_initialized() else "gloo"
        return self.device if backend == "nccl" else torch.device("cpu")
