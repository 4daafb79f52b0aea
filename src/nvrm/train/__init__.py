"""Train NVRM-style reward models: Bradley-Terry (with ties) on preference pairs, LoRA, export.

It imports the scoring library (same preprocessing code path); the library never imports it.

    fit(base, pairs, output, config) -> Summary      fine-tune, export OUTPUT/bundle and check it (nvrm train)
    prepare_store(model, pairs_files, store) -> StoreBuild   videos prepared once, here or on Ray (nvrm prefs prepare)
    fit_guard(model, pairs) -> Guard                 a bundle's guard from pairs and its own hacked candidates (nvrm guard fit)
    add_member(model, member, pairs) -> (folder, Calibration)   the guard's opt-in check: another model, calibrated (nvrm guard member)
"""

from .config import TrainConfig
from .fit import RayStore, StoreBuild, Summary, fit, prepare_store

_LAZY = {"fit_guard": "guard_fit", "read_references": "guard_fit", "add_member": "member_fit"}
"""Names imported on first use: the guard's fit needs torch at import, and ``nvrm train --help`` must not."""


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["TrainConfig", "fit", "Summary", "prepare_store", "StoreBuild", "RayStore", "fit_guard", "read_references", "add_member"]
