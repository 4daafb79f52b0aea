"""``nvrm bench``: workloads that compare paths side by side in one run.

- ``files``: the naive reference vs ``score_batch`` vs ``score_group`` on encoded files;
- ``rl``: a world-model RL step with in-memory frames: stages, paths, overlap, TFLOP/s;
- ``engine``: the preprocessing engine's frames/s by worker count and kind;
- ``vision``: the vision path before and after batching its attention;
- ``grad``: the differentiable reward's forward + backward (with and without checkpointing) vs forward;
- ``train``: training at 1 vs 2 processes, memory with a store vs in memory, store build rate;
- ``train-step``: optimizer steps at the model's own shapes, checkpointing on vs off.
"""

from .harness import clean_json
from .preprocessing import format_engine, run_engine
from .files import format_table, run_bench
from .grad import format_grad, run_grad
from .rl import format_rl, run_rl
from .training import format_train, format_train_step, run_train_bench, run_train_step
from .vision_tower import format_vision, run_vision

__all__ = ["run_bench", "format_table", "run_rl", "format_rl", "run_engine", "format_engine", "run_vision", "format_vision", "run_grad", "format_grad", "run_train_bench", "format_train",
           "run_train_step", "format_train_step", "clean_json"]
