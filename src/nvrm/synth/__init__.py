"""Synthetic material the demo, the benchmarks and the tests build on the fly.

- ``bundles``: random-weight bundles in the exact release layout, at any
  architecture size (tiny for tests, mid for CPU benchmarks, the real
  Qwen3-VL-4B shapes for GPU benchmarks);
- ``clips``: generated video clips (a moving square over a texture).

Nothing here is the release: rewards from these bundles are computed, not judged.
"""
