"""Shared fixtures: hermetic caches, tiny release-layout bundles, generated clips."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

# Hermetic: no Hub access, no writes to the user's caches.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

_ROOT_ENV = "NVRM_TEST_ROOT"


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """Everything a test run writes to a temp folder lives in one folder of its own, removed at the end:
    pytest's tmp paths, ``TMPDIR`` (and so subprocesses' temp files and the servers' logs) and Ray's
    session folders. A pytest run inside a test (the capability and version matrices) nests in it.
    ``NVRM_KEEP_TEST_TMP=1`` keeps it (its path is printed)."""
    import multiprocessing.util
    import tempfile

    # multiprocessing removes its own temp folder at exit, after this run's folder is gone: it lives
    # in the system temp folder, made now (before TMPDIR moves), and goes away with the process
    multiprocessing.util.get_temp_dir()
    # a worker of make test's two gets a folder of its own beside the controller's, not inside it: Ray's socket paths
    # under a nested folder pass AF_UNIX's 107-byte limit (a nested run inside a test still nests)
    parent = os.path.dirname(os.environ[_ROOT_ENV]) if hasattr(config, "workerinput") and os.environ.get(_ROOT_ENV) else os.environ.get(_ROOT_ENV)
    root = tempfile.mkdtemp(prefix="nvrm-tests-", dir=parent or None)
    config._nvrm_test_root = root
    os.environ[_ROOT_ENV] = root
    for name, sub in (("TMPDIR", "tmp"), ("RAY_TMPDIR", "ray")):
        os.makedirs(os.path.join(root, sub))
        os.environ[name] = os.path.join(root, sub)
    tempfile.tempdir = None  # re-read TMPDIR
    if config.option.basetemp is None or hasattr(config, "workerinput"):
        # a worker of ``make test``'s two keeps its tmp paths in its own folder too (xdist hands it one under
        # the controller's basetemp otherwise)
        config.option.basetemp = os.path.join(root, "pytest")
    # torch.compile's kernels (inductor's FX-graph and C++ caches, keyed by inductor on the graph, torch and the ISA)
    # are kept beside the test environments, one folder per ATen capability, so a second run does not build them again
    # (the compiled test: 38 s cold, 19 s warm); subprocesses and nested runs inherit the folder
    envs = os.environ.get("NVRM_TEST_ENVS")
    if envs and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(envs, "inductor", os.environ.get("ATEN_CPU_CAPABILITY") or "native")
    # one lock for the run's workers (they inherit this variable; see pytest_runtest_setup)
    os.environ.setdefault(_EXCLUSIVE_ENV, os.path.join(root, "exclusive.lock"))


_EXCLUSIVE_ENV = "NVRM_EXCLUSIVE_LOCK"
_exclusive: list = []  # the open lock file while this process holds the lock


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_setup(item):
    """A module marked ``exclusive`` holds a lock shared by the run's workers (``make test`` runs two) from its first
    test's setup, before its fixtures, to its last test's teardown: no two memory-hungry modules run at once."""
    if item.get_closest_marker("exclusive") is not None and not _exclusive:
        import fcntl

        lock = open(os.environ[_EXCLUSIVE_ENV], "a")
        fcntl.flock(lock, fcntl.LOCK_EX)
        _exclusive.append(lock)
    yield


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_runtest_teardown(item, nextitem):
    yield  # the module's fixtures are finalized here when nextitem is in another module
    if _exclusive and (nextitem is None or nextitem.module is not item.module):
        _exclusive.pop().close()  # closing the file releases the lock


_EXCLUSIVE_UNIT = "exclusive modules"
_TIER_ORDER = {"versions": 1, "trainers": 1, "e2e": 2, "hostile": 2}  # then the rest (3), tests/unit last (4)


@functools.cache
def _is_exclusive_module(path: str) -> bool:
    """Whether a test file marks itself ``exclusive`` (its module's ``pytestmark``), read from its source: the
    controller schedules by node id, before any worker has imported a module."""
    try:
        text = Path(path).read_text()
    except OSError:
        return False
    return any(line.startswith("pytestmark") and "mark.exclusive" in line for line in text.splitlines())


def pytest_xdist_make_scheduler(config, log):
    """``make test``'s workers take a file at a time (``--dist loadfile``), with two changes:

    - the ``exclusive`` modules form one unit, run one after another by one worker, first: before, a worker that
      drew one while the other held the lock sat idle (the memory modules' setups waited 155 s in one run);
    - the heavier tiers go first (versions and trainers, then e2e and hostile, then the rest, unit tests last), so
      the run does not end on one worker finishing a long test while the other has nothing left."""
    if config.getoption("dist", None) != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Scheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return _EXCLUSIVE_UNIT if _is_exclusive_module(os.path.join(str(config.rootpath), path)) else path

        def _assign_work_unit(self, node) -> None:
            def rank(scope: str) -> int:
                if scope == _EXCLUSIVE_UNIT:
                    return 0
                parts = Path(scope).parts
                tier = parts[1] if len(parts) > 2 and parts[0] == "tests" else ""
                return 4 if tier == "unit" else _TIER_ORDER.get(tier, 3)

            # min keeps the queue's order (xdist's: most tests first) among scopes of one rank
            self.workqueue.move_to_end(min(self.workqueue, key=rank), last=False)
            super()._assign_work_unit(node)

    return Scheduling(config, log)


def pytest_unconfigure(config):
    import shutil

    root = getattr(config, "_nvrm_test_root", None)
    if root is None:
        return
    if os.environ.get("NVRM_KEEP_TEST_TMP") == "1":
        print(f"\nnvrm: test files kept in {root}")
        return
    shutil.rmtree(root, ignore_errors=True)


SLOW_TIERS = ("e2e", "hostile", "trainers", "versions")
"""Tiers whose tests start servers, subprocesses, trainers or other environments: all of them count as ``slow``."""


def pytest_collection_modifyitems(config, items):
    """Every test in a slow tier carries the ``slow`` marker (``make check`` leaves them out); tests that compare
    against transformers' own forward run only where it computes the release's numerics."""
    here = Path(__file__).resolve().parent
    for item in items:
        parts = Path(str(item.fspath)).resolve().relative_to(here).parts if str(item.fspath).startswith(str(here)) else ()
        if parts and parts[0] in SLOW_TIERS:
            item.add_marker(pytest.mark.slow)
    forward = [item for item in items if "transformers_forward" in item.keywords]
    if not forward:
        return  # a run without such tests (a nested run, a narrow selection) never imports transformers here
    from nvrm.forward import compat

    if compat.SHARES_RELEASE_VISION_NUMERICS:
        return
    import transformers

    skip = pytest.mark.skip(
        reason=f"transformers {transformers.__version__} no longer computes 4.57.6's vision numerics, so its own forward "
        "is no reference; tests/versions compares nvrm here against the release profile instead"
    )
    for item in forward:
        item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _hermetic_cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("nvrm-cache")
    old = os.environ.get("NVRM_CACHE_DIR")
    os.environ["NVRM_CACHE_DIR"] = str(cache)
    os.environ["HF_HOME"] = str(cache / "hf")
    yield cache
    if old is None:
        os.environ.pop("NVRM_CACHE_DIR", None)
    else:
        os.environ["NVRM_CACHE_DIR"] = old


@pytest.fixture(scope="session")
def vae(tmp_path_factory) -> Path:
    """A random tiny Wan2.1 VAE (diffusers' layout) for the latent decoder: seeded, so every test that asks gets the same."""
    import torch
    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("vae") / "tiny"
    AutoencoderKLWan(base_dim=8, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=1, attn_scales=[],
                     temperal_downsample=[False, True, True]).save_pretrained(str(path))
    return path


@pytest.fixture(scope="session")
def tiny_bundle(tmp_path_factory) -> Path:
    from nvrm.synth.bundles import build_tiny_bundle

    return build_tiny_bundle(tmp_path_factory.mktemp("bundle") / "tiny")


@pytest.fixture(scope="session")
def deep_bundle(tmp_path_factory) -> Path:
    """The tiny bundle at the release's depth (36 text layers, narrow): built once a run (seconds), read-only."""
    from nvrm.synth.bundles import ArchSpec, build_tiny_bundle

    return build_tiny_bundle(tmp_path_factory.mktemp("deep") / "deep36", ArchSpec.from_name("deep"), revision="deep-36")


@pytest.fixture(scope="session")
def model(tiny_bundle):
    from nvrm import RewardModel

    return RewardModel.from_pretrained(tiny_bundle, device="cpu")


@pytest.fixture(scope="session")
def demo(tmp_path_factory):
    """The shipped demo model with the demo's clips: (model, context path, {name: candidate path})."""
    from nvrm import RewardModel
    from nvrm.cli.demo import demo_bundle_path, write_demo_clips

    ctx, cands = write_demo_clips(tmp_path_factory.mktemp("democlips"))
    m = RewardModel.from_pretrained(demo_bundle_path(), device="cpu")
    yield m, ctx, cands
    m.close()


@pytest.fixture(scope="session")
def model32(tiny_bundle):
    """The tiny bundle in float32 with a float32 head: gradients and tolerances without bf16 rounding."""
    from nvrm import Contract, RewardModel

    m = RewardModel.from_pretrained(tiny_bundle, device="cpu", dtype="float32", contract=Contract(head_dtype="float32"))
    yield m
    m.close()


@pytest.fixture(scope="session")
def clips(tmp_path_factory) -> dict[str, Path]:
    """A few small encoded clips: 6 s contexts/candidates at 8 fps."""
    from nvrm.synth.clips import moving_square, write_video

    d = tmp_path_factory.mktemp("clips")
    out = {
        "context": write_video(d / "context.mp4", moving_square(48, 96, 128, seed=1), 8),
        "cand_a": write_video(d / "cand_a.mp4", moving_square(48, 96, 128, seed=2), 8),
        "cand_b": write_video(d / "cand_b.mp4", moving_square(48, 96, 128, seed=3, speed=7), 8),
        "short": write_video(d / "short.mp4", moving_square(32, 96, 128, seed=4), 8),  # 4.0 s
    }
    return out
