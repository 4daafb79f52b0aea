"""``nvrm bench``: workloads that compare paths side by side in one run.

- ``files``: the naive reference vs ``score_batch`` vs ``score_group`` on encoded files;
- ``rl``: a world-model RL step with in-memory frames: stages, paths, overlap, TFLOP/s;
- ``engine``: the preprocessing engine's frames/s by worker count and kind;
- ``vision``: the vision path before and after batching its attention;
- ``grad``: the differentiable reward's forward + backward (with and without checkpointing) vs forward;
- ``train``: training at 1 vs 2 processes, memory with a store vs in memory, store build rate;
- ``train-step``: optimizer steps at the model's own shapes, checkpointing on vs off;
- ``backend-parity``: the vLLM backend vs nvrm's exact path: speed, float32 and bfloat16 drift, rank agreement.
"""

from .backend_parity import format_backend_parity, run_backend_parity
from .harness import clean_json
from .preprocessing import format_engine, run_engine
from .files import format_table, run_bench
from .grad import format_grad, run_grad
from .rl import format_rl, run_rl
from .training import format_train, format_train_step, run_train_bench, run_train_step
from .vision_tower import format_vision, run_vision

__all__ = ["run_bench", "format_table", "run_rl", "format_rl", "run_engine", "format_engine", "run_vision", "format_vision",
           "run_grad", "format_grad", "run_train_bench", "format_train", "run_train_step", "format_train_step", "clean_json",
           "run_backend_parity", "format_backend_parity"]


# The fidelity oracle moved to nvrm.fidelity in 0.5. Its old paths keep working until 0.6, with a DeprecationWarning:
# ``from nvrm.bench import numerics`` through ``__getattr__``, and ``import nvrm.bench.numerics`` /
# ``from nvrm.bench.numerics import X`` through a finder that hands the import system the moved module itself
# (no second file: module file names are unique across src/nvrm, tests/unit/test_layout.py).
import importlib as _importlib  # noqa: E402
import importlib.abc as _abc  # noqa: E402
import importlib.util as _util  # noqa: E402
import sys as _sys  # noqa: E402
import warnings as _warnings  # noqa: E402

_MOVED = {"reference": "nvrm.fidelity.reference", "numerics": "nvrm.fidelity.numerics"}


def _moved(leaf: str):
    _warnings.warn(f"nvrm.bench.{leaf} is deprecated and goes in 0.6: it moved to {_MOVED[leaf]}", DeprecationWarning, stacklevel=3)
    return _importlib.import_module(_MOVED[leaf])


def __getattr__(name: str):
    if name in _MOVED:
        return _moved(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _MovedFinder(_abc.MetaPathFinder, _abc.Loader):
    """Finds ``nvrm.bench.reference`` / ``nvrm.bench.numerics`` and loads them as the moved modules (same object)."""

    def find_spec(self, fullname, path=None, target=None):
        prefix, _, leaf = fullname.rpartition(".")
        return _util.spec_from_loader(fullname, self) if prefix == __name__ and leaf in _MOVED else None

    real_specs: dict = {}

    def create_module(self, spec):
        module = _moved(spec.name.rpartition(".")[2])
        self.real_specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module):
        module.__spec__ = self.real_specs[module.__spec__.name]  # the import system stamped the alias's spec on it


if not any(isinstance(f, _MovedFinder) for f in _sys.meta_path):
    _sys.meta_path.append(_MovedFinder())
