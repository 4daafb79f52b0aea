"""Helpers shared by the test modules (imported as ``helpers``; pytest puts tests/ on sys.path)."""

from __future__ import annotations

import os


from nvrm.fidelity.numerics import BATCH_DRIFT_ULPS, GROUP_DRIFT_ULPS, bf16_ulp, ulps  # noqa: F401 - one source for the bounds


def exit_job(state, code: int) -> None:
    """A worker job that kills its worker process (for crash-recovery tests)."""
    os._exit(code)


def exit_once_job(state, marker: str) -> str:
    """Kills its worker the first time (creating ``marker``), succeeds when run again."""
    if not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(3)
    return "second try"


def echo_job(state, value):
    """Returns its argument and the worker's pid."""
    return value, os.getpid()


# The drift bounds live in nvrm.fidelity.numerics (measured by benchmarks/drift_sweep.py; README "Fidelity").
GROUP_ULPS = GROUP_DRIFT_ULPS
BATCH_ULPS = BATCH_DRIFT_ULPS


def release_files():
    """The vendored Qwen3-VL-4B-Instruct release files (tests/data/qwen3-vl-4b-instruct)."""
    from pathlib import Path

    return Path(__file__).parent / "data" / "qwen3-vl-4b-instruct"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def in_threads(fn, n: int) -> None:
    """``fn(i)`` for i in range(n), each on its own thread, all started before any is joined."""
    import threading

    threads = [threading.Thread(target=fn, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def memory_mib(pid: int) -> dict[str, int]:
    """A process's address-space peak (VmPeak), resident high-water mark (VmHWM) and resident size (VmRSS), in MiB."""
    out = {}
    for line in open(f"/proc/{pid}/status"):
        key, _, value = line.partition(":")
        if key in ("VmPeak", "VmHWM", "VmRSS"):
            out[key] = int(value.split()[0]) // 1024
    return out


def cap_address_space(gb: float) -> None:
    """RLIMIT_AS for this process (call in a child: ``preexec_fn``): allocations past it fail."""
    import resource

    limit = int(gb * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


class InProcessServer:
    """The service app in this process, over a loaded model: no port, no subprocess (the logic tests).

    ``get`` / ``post`` are a ``fastapi.testclient.TestClient``'s (paths relative to the app);
    ``client(**kw)`` is a ``RewardClient`` that sends through it. Use ``Server`` for what needs a
    process: signals, address-space caps, uvicorn's connection limits, the CLI.
    """

    url = "http://testserver"

    def __init__(self, model, **config):
        from fastapi.testclient import TestClient

        from nvrm.serve.app import create_app
        from nvrm.serve.config import ServeConfig

        self.app = create_app(model, ServeConfig(**config))
        self.http = TestClient(self.app, raise_server_exceptions=False)
        self.http.__enter__()  # runs the app's lifespan: the scheduler starts
        self.serving = self.app.state.nvrm

    def get(self, path: str, **kw):
        return self.http.get(path, **kw)

    def post(self, path: str, **kw):
        return self.http.post(path, **kw)

    def client(self, **kw):
        import httpx

        from nvrm.client import RewardClient

        return RewardClient(self.url, http=self.http, ahttp=httpx.AsyncClient(transport=httpx.ASGITransport(self.app), base_url=self.url), **kw)

    def stop(self):
        self.http.__exit__(None, None, None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


class Server:
    """``nvrm serve`` in a subprocess on a free loopback port, ready when constructed."""

    def __init__(self, bundle, *extra, env=None, address_space_gb: float | None = None):
        import subprocess
        import sys
        import time
        from pathlib import Path

        import httpx

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        import tempfile

        self.log = open(Path(tempfile.gettempdir()) / f"nvrm-serve-{self.port}.log", "w+")  # the test run's own temp folder
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "nvrm"), "serve", "--model", str(bundle), "--port", str(self.port), *map(str, extra)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            preexec_fn=None if address_space_gb is None else (lambda: cap_address_space(address_space_gb)),
        )
        deadline = time.time() + 180
        while time.time() < deadline:
            assert self.proc.poll() is None, self.output()
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError("server did not become ready: " + self.output())

    def get(self, path: str, **kw):
        import httpx

        return httpx.get(self.url + path, **kw)

    def post(self, path: str, **kw):
        import httpx

        return httpx.post(self.url + path, **kw)

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-3000:]

    STOP_WAIT_S = 30
    """How long ``stop`` waits after SIGTERM before it kills."""

    def stop(self):
        import signal
        import subprocess

        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(self.STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


def run_checked(cmd, **kw) -> str:
    """Run ``cmd``; its stdout, or an assertion error with the command and the tails of its output."""
    import subprocess

    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def metric_sum(text: str, name: str, **labels: str) -> float:
    """The sum of Prometheus samples ``name`` in ``text`` whose labels include ``labels`` (any label order)."""
    import re

    total = 0.0
    for line in text.splitlines():
        m = re.fullmatch(r"([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)", line.strip())
        if not m or m.group(1) != name:
            continue
        have = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(m.group(3))
    return total


class RayServer(Server):
    """``nvrm serve --ray`` in a subprocess on a free loopback port (a local Ray cluster), ready when constructed."""

    STOP_WAIT_S = 60  # Ray Serve takes longer to shut down

    def __init__(self, bundle, *extra, env=None, timeout: float = 300):
        import subprocess
        import sys
        import tempfile
        import time
        from pathlib import Path

        import httpx

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(Path(tempfile.gettempdir()) / f"nvrm-ray-{self.port}.log", "w+")
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "nvrm"), "serve", "--model", str(bundle), "--ray", "--port", str(self.port), *map(str, extra)],
            stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **(env or {})},
        )
        deadline = time.time() + timeout
        while time.time() < deadline:
            assert self.proc.poll() is None, self.output()
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        self.stop()
        raise AssertionError("ray serve did not become ready")



def guarded_copy(bundle, folder):
    """A copy of ``bundle`` with a guard fitted from its own readings, fast (no attacks): ``nvrm bench``'s stand-in guard
    (noisy copies stand in for hacked candidates; ``nvrm guard fit``'s own attacks are tested in
    tests/e2e/test_guard_cli.py). Returns the copy's path."""
    from nvrm.bench.hacking import standin_guard

    return standin_guard(bundle, folder)


def member_of(bundle, folder, seed: int):
    """Another model of ``bundle``'s architecture and preprocessing, written to ``folder``: its head moved at random (a
    stand-in for one trained from another seed), so its rewards differ but still rise with the bundle's."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from nvrm.bundle import write_manifest

    shutil.copytree(bundle, folder)
    (folder / "nvrm_guard.safetensors").unlink(missing_ok=True)
    head = load_file(folder / "nvrm_head.safetensors")
    g = torch.Generator().manual_seed(seed)
    w = head["rm_head.weight"]
    head["rm_head.weight"] = w + 0.5 * w.abs().mean() * torch.randn(w.shape, generator=g).to(w.dtype)
    save_file(head, folder / "nvrm_head.safetensors")
    manifest = folder / "RELEASE_MANIFEST.json"
    if manifest.exists():
        manifest.unlink()
    write_manifest(folder, revision=f"member-{seed}")
    return folder


def doubting_member(folder, member_folder, pairs):
    """A member of ``folder`` (a guarded bundle) added by ``add_member`` on ``pairs``, its calibration's shift then lowered so
    that its bar (``scale * r + shift + margin``) lies 4 below the line: it doubts every candidate, so a test sees the doubt
    it adds. Returns (the member's own bundle, the lowered ``Calibration``)."""
    import dataclasses

    from nvrm import RewardModel
    from nvrm.guard.members import MEMBER_FILE, Calibration
    from nvrm.guard.sidecar import list_in_manifest
    from nvrm.train import add_member

    member = member_of(folder, member_folder, seed=5)
    with RewardModel.from_pretrained(folder, device="cpu") as m:
        written, cal = add_member(m, member, pairs)
    assert cal.corr > 0 and cal.candidates >= 8 and cal.margin >= 0
    lowered = dataclasses.replace(Calibration.read(written / MEMBER_FILE), shift=cal.shift - 4.0 - cal.margin)
    (written / MEMBER_FILE).write_text(lowered.to_json())
    list_in_manifest(folder / "RELEASE_MANIFEST.json", written / MEMBER_FILE, folder)
    return member, lowered
