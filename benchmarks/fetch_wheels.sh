#!/usr/bin/env bash
# Download the pinned wheels the bare, offline GPU machine needs into .whl/ (git-ignored).
# Run here (on a machine with PyPI access) before `run` on the device with carry [".whl"].
# About 55 MB; the device machine has Python 3.12 and torch/torchvision preinstalled.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
PY=${PYTHON:-python3}
for p in transformers==4.57.6 tokenizers==0.22.2 huggingface_hub==0.36.0 qwen-vl-utils==0.0.14 av==18.1.0 \
         accelerate==1.13.0 safetensors==0.8.0 \
         fastapi==0.165.0 starlette==1.10.0 pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 \
         typing-inspection==0.4.5 uvicorn==0.54.0 opentelemetry-api==1.45.2 h11==0.16.0 click==8.5.1 httpx==0.28.1 httpcore==1.0.9 anyio==4.16.0 sniffio==1.3.1 \
         python-multipart==0.0.34 prometheus_client==0.26.0 tenacity==9.1.2 idna==3.20 certifi==2026.10.19.post1; do
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl "$p" \
    || echo "fetch_wheels: could not download $p" >&2
done
du -sh .whl
