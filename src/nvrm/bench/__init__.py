"""``nvrm bench``: workloads that compare paths side by side in one run.

- ``files``: the naive reference vs ``score_batch`` vs ``score_group`` on encoded files;
- ``rl``: a world-model RL step with in-memory frames: stages, paths, overlap, TFLOP/s;
- ``engine``: the preprocessing engine's frames/s by worker count and kind;
- ``vision``: the vision path before and after batching its attention;
- ``grad``: the differentiable reward's forward + backward (with and without checkpointing) vs forward.
"""

from .harness import clean_json
from .preprocessing import format_engine, run_engine
from .files import format_table, run_bench
from .grad import format_grad, run_grad
from .rl import format_rl, run_rl
from .vision_tower import format_vision, run_vision

__all__ = ["run_bench", "format_table", "run_rl", "format_rl", "run_engine", "format_engine", "run_vision", "format_vision", "run_grad", "format_grad", "clean_json"]
