"""A real vision-language judge for the tests: ``transformers serve`` (4.57.6) on a tiny random-weight
Qwen3-VL chat model built here from the vendored release files.

The model is ``Qwen3VLForConditionalGeneration`` at nvrm's tiny widths, with the release's own
tokenizer, processor and chat template (``tests/data/qwen3-vl-4b-instruct``), saved by
``save_pretrained``: what serve loads by ``config.architectures[0]``. Serve needs ``openai`` for
its request types; it comes from a pinned overlay (``openai`` 1.109.1 with ``distro`` and
``sniffio``, no dependencies: serve imports only its types). What serve does that the tests rely on:

- it always answers as a server-sent event stream and reports no usage;
- it writes each base64 image it receives to a PNG in its ``TMPDIR`` (never removed), which is how a
  test counts the images that arrived;
- it loads the model on the first request (``--force-model`` names it for every request).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from helpers import free_port, release_files
from overlays import overlay

OPENAI = ["openai==1.109.1", "distro==1.9.0", "sniffio==1.3.1"]


def build_chat_vlm(out: Path) -> Path:
    """A random-weight Qwen3-VL chat model in ``out`` (about 40 MB)."""
    import json
    import tempfile

    import torch
    from transformers import AutoProcessor, GenerationConfig, Qwen3VLConfig, Qwen3VLForConditionalGeneration

    from nvrm.synth.bundles import RELEASE_ASSETS, ArchSpec, shrink_config

    src = release_files()
    with tempfile.TemporaryDirectory() as tmp:
        stage = Path(tmp)
        import gzip

        for name in RELEASE_ASSETS:
            plain, packed = src / name, src / (name + ".gz")
            if plain.is_file():
                (stage / name).write_bytes(plain.read_bytes())
            elif packed.is_file():
                (stage / name).write_bytes(gzip.decompress(packed.read_bytes()))
        config = shrink_config(json.loads((src / "config.json").read_text()), ArchSpec())
        config["architectures"] = ["Qwen3VLForConditionalGeneration"]
        config["text_config"]["dtype"] = "float32"
        (stage / "config.json").write_text(json.dumps(config))
        processor = AutoProcessor.from_pretrained(str(stage))
        cfg = Qwen3VLConfig.from_pretrained(str(stage))
        generation = GenerationConfig.from_pretrained(str(stage))
    torch.manual_seed(0)
    model = Qwen3VLForConditionalGeneration(cfg).eval()
    model.generation_config = generation
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    processor.save_pretrained(str(out))
    return out


class TransformersServe:
    """``transformers serve`` in a subprocess on a free loopback port, serving ``model`` to every request."""

    def __init__(self, model: Path, workdir: Path):
        self.model = model
        self.tmp = workdir / "serve-tmp"
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.log = workdir / "serve.log"
        self.proc: subprocess.Popen | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def images_received(self) -> int:
        """Base64 images the server has decoded so far (each one a PNG in its TMPDIR)."""
        return len(list(self.tmp.glob("*.png")))

    def failures(self) -> str:
        """The end of the server's log when it raised while answering (a model loaded in two requests at once breaks
        both: each raises, and a retry may hide it from the client), else an empty string."""
        text = self.log.read_text(errors="replace") if self.log.is_file() else ""
        return text[-3000:] if "Traceback" in text else ""

    def start(self) -> "TransformersServe":
        site = overlay(OPENAI, "tfserve-openai", no_deps=True)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
               "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "CUDA_VISIBLE_DEVICES": "",
               "OMP_NUM_THREADS": "2", "TMPDIR": str(self.tmp), "TRANSFORMERS_VERBOSITY": "error"}
        serve = Path(sys.executable).with_name("transformers")
        for _ in range(3):  # a port taken between choosing and binding: try another
            self.port = free_port()
            cmd = [str(serve), "serve", "--host", "127.0.0.1", "--port", str(self.port), "--device", "cpu", "--dtype", "float32",
                   "--force-model", str(self.model), "--model-timeout", "3600", "--log-level", "warning"]
            self.proc = subprocess.Popen(cmd, env=env, stdout=self.log.open("ab"), stderr=subprocess.STDOUT)
            if self._ready(90.0):
                return self
        raise RuntimeError(f"transformers serve did not start: {self.log.read_text()[-2000:]}")

    def _ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2.0).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        self.stop()
        return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()  # a generate thread may still run: serve does not stop it on disconnect
            self.proc.wait(timeout=30)


class CountingProxy:
    """A loopback TCP relay in front of a server that records the most connections open at once:
    the judge's concurrency bound as the server's side of the network sees it."""

    def __init__(self, port: int):
        import socket
        import threading

        self.target = port
        self.lock = threading.Lock()
        self.open = 0
        self.most = 0
        self.total = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _accept(self) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            with self.lock:
                self.open += 1
                self.total += 1
                self.most = max(self.most, self.open)
            done = threading.Event()
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b, done), daemon=True).start()

    def _pipe(self, src, dst, done) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(2)
                except OSError:
                    pass
            with self.lock:
                if not done.is_set():
                    done.set()
                    self.open -= 1

    def close(self) -> None:
        self.listener.close()


class RawJudge:
    """A chat-completions server on loopback that answers exactly the bytes it is told to: each request gets
    ``answer(body) -> (status, headers, data, trickle_s)``, ``data`` sent as given (already gzipped, say) and,
    with ``trickle_s`` > 0, one byte at a time with that pause between bytes. The hostile judges of
    tests/hostile/test_judge_answers.py (issue 43): gzip bombs, slow trickles, HTML pages, redirects."""

    def __init__(self, answer):
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.answer = answer
        self.requests: list[dict] = []
        judge = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                judge.requests.append(body)
                status, headers, data, trickle_s = judge.answer(body)
                try:
                    self.send_response(status)
                    for k, v in {"Content-Type": "application/json", "Content-Length": str(len(data)), **headers}.items():
                        self.send_header(k, v)
                    self.end_headers()
                    if trickle_s <= 0:
                        self.wfile.write(data)
                        return
                    for i in range(len(data)):
                        self.wfile.write(data[i : i + 1])
                        self.wfile.flush()
                        time.sleep(trickle_s)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
