"""A member for a bundle's guard: another reward model, put in the bundle's units on genuine candidates (``nvrm guard member``).

``add_member(model, member, pairs)`` scores every distinct candidate of the pairs (both sides) with the bundle and with the
member, fits the line from the member's rewards to the bundle's (``nvrm.guard.members.fit_calibration``), and copies the
member into the bundle (``nvrm_members/NAME``, listed in its manifest). The member must share the bundle's architecture
and preprocessing: it is trained from the same base with ``nvrm train``, on other data or from another seed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

from ..errors import BundleError, ConfigError, InputError, NvrmError


def add_member(model, member: str | Path, pairs: str | Path | Sequence[Any], *, name: str | None = None,
               say: Callable[[str], None] = lambda _: None) -> tuple[Path, Any]:
    """Calibrate bundle ``member`` against ``model`` (a loaded ``RewardModel`` with a guard) on ``pairs``' candidates and write it
    into ``model``'s bundle. Returns (its folder, its ``Calibration``)."""
    from ..bundle import preprocessing_fingerprint, weights_fingerprint
    from ..guard.members import bundle_config, check_architecture, fit_calibration, member_folders, write_member
    from ..prefs.pairs import Pair, read_pairs
    from ..scoring.reward_model import RewardModel
    from .guard_fit import sides_of

    if model.path is None or getattr(model, "runtime", None) is None:
        raise ConfigError("add_member needs a model loaded from a bundle folder on nvrm's engine (backend='nvrm')")
    if model.guard is None:
        raise ConfigError(f"{model.path}: has no guard; members are the guard's opt-in check (fit one first with nvrm guard fit)")
    source = Path(member)
    if not (source / "config.json").is_file():
        raise BundleError(f"{source}: not a bundle folder (no config.json); give the bundle nvrm train exported (OUTPUT/bundle)")
    check_architecture(source, bundle_config(model.path), f"{model.path}'s")
    if preprocessing_fingerprint(source, model.contract) != model.fingerprint:
        raise BundleError(f"{source}: its processor, tokenizer or template differ from {model.path}'s; a member must read the same inputs")
    if Path(source).resolve() == Path(model.path).resolve():
        raise InputError(f"member {source}", "is the bundle itself; a member must be another model (trained on other data or from another seed)")
    rows = read_pairs(pairs) if isinstance(pairs, (str, Path)) else list(pairs)
    sides = sides_of([p for p in rows if isinstance(p, Pair)])
    other = RewardModel.from_pretrained(source, contract=model.contract, settings=model.settings.replace(members=False, member_rate=0.0))
    try:
        ours, theirs_r = [], []
        by_condition: dict[tuple[str, str], list[Any]] = {}
        for sd in sides:
            by_condition.setdefault((sd.prompt, str(sd.context)), []).append(sd)
        for (prompt, context), group in by_condition.items():
            videos = [sd.video for sd in group]
            a = model.score_group(prompt, context, videos, errors="return")
            b = other.score_group(prompt, context, videos, errors="return")
            for x, y in zip(a, b):
                if not isinstance(x, NvrmError) and not isinstance(y, NvrmError):
                    ours.append(x.reward)
                    theirs_r.append(y.reward)
        say(f"scored {len(ours)} candidate(s) under {len(by_condition)} condition(s) with both models")
    finally:
        other.close()
    cal = fit_calibration(ours, theirs_r, model=weights_fingerprint(model.path), member=weights_fingerprint(source),
                          preprocessing=model.fingerprint, where=str(pairs) if isinstance(pairs, (str, Path)) else "pairs")
    taken = {p.name for p in member_folders(model.path)}
    name = name or next(f"member-{k}" for k in range(1, len(taken) + 2) if f"member-{k}" not in taken)
    folder = write_member(model.path, name, source, cal)
    say(f"member {name}: reward ~ {cal.scale:.3f} * member + {cal.shift:+.3f}, margin {cal.margin:.2f} (correlation {cal.corr:.3f} over "
        f"{cal.candidates} candidates)")
    return folder, cal
