#!/usr/bin/env bash
# The GPU measurements, as one script for the bare, offline H200 machine (see ../shared/notes/gpu.md).
#
#   here:    bash benchmarks/fetch_wheels.sh        # once: the pinned wheels into .whl/ (git-ignored)
#   device:  run(command="bash benchmarks/gpu.sh", carry=[".whl"], timeout_s=540)
#   CPU dry run (no install, tiny model):  ARCH=tiny GS=2,4 NGROUPS=2 SIZE=96x128 VAE=tiny LATENT=8x12 TRAIN_PAIRS=2 OUT=/tmp/gpu-dry PY=.venv/bin/python bash benchmarks/gpu.sh
#
# Every step writes its JSON under $OUT as soon as it finishes and has its own time limit,
# so a step that runs long still leaves the others' results. The whole run, wheel install
# included, is sized for 8 minutes on an H200 at the real 4B shapes.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/nvrm-gpu}
ARCH=${ARCH:-4b}
GS=${GS:-8,16,32,64}
NGROUPS=${NGROUPS:-4}
SIZE=${SIZE:-480x832}
PY=${PY:-python3}
mkdir -p "$OUT"
LOG="$OUT/log.txt"
say() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$LOG"; }

if [ -d .whl ] && [ "${SKIP_INSTALL:-0}" != 1 ]; then
  say "installing the pinned wheels"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >>"$LOG" 2>&1 || { say "wheel install failed"; exit 3; }
  export PYTHONPATH=/tmp/site:$PWD/src
else
  export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false NVRM_CACHE_DIR=${NVRM_CACHE_DIR:-/tmp/nvrm-cache}
NVRM=("$PY" -c "import sys; from nvrm.cli.main import main; sys.exit(main())")

"$PY" - >"$OUT/env.json" 2>>"$LOG" <<'EOF'
import json, os, platform, torch, transformers
info = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
        "cuda": torch.cuda.is_available(), "cpus": os.cpu_count()}
if torch.cuda.is_available():
    info["gpu"] = torch.cuda.get_device_name(0)
    info["gpu_memory_gb"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
print(json.dumps(info))
EOF
say "env: $(cat "$OUT/env.json")"

step() {  # step NAME SECONDS ARGS... : one nvrm command, its JSON to $OUT/NAME.json
  local name=$1 limit=$2; shift 2
  say "step $name (limit ${limit}s)"
  local t0=$SECONDS
  timeout "$limit" "${NVRM[@]}" "$@" --output "$OUT/$name.json" >"$OUT/$name.txt" 2>>"$LOG"
  local rc=$?
  say "step $name: exit $rc after $((SECONDS - t0)) s"
  cat "$OUT/$name.txt" >>"$LOG" 2>/dev/null
}

# 1. the bundle (random weights, real shapes), built once and reused by every step
say "building the $ARCH bench bundle"
timeout 150 "$PY" -c "from nvrm.bench.harness import build_bench_bundle; print(build_bench_bundle('$ARCH'))" >>"$LOG" 2>&1 || say "bundle build failed"

# 2. the RL workload: G = 8, 16, 32, 64 with in-memory 480x832 frames, 10 s context, 5 s candidates
step rl 240 bench --workload rl --arch "$ARCH" --G "$GS" --n-groups "$NGROUPS" --size "$SIZE" --context-s 10 --fps 8

# 3. the preprocessing engine on this machine's cores: threads vs processes
CORES=$("$PY" -c "import os; print(len(os.sched_getaffinity(0)))")
step engine 60 bench --workload engine --arch tiny --size "$SIZE" --engine-configs "thread:1,thread:$CORES,process:1,process:$CORES"

# 4. the vision path before/after on 80 equal-size frames
step vision 40 bench --workload vision --arch "$ARCH" --frames 80

# 5. the file workload (H.264 files): naive reference vs batch vs group
step files 90 bench --workload files --arch "$ARCH" --groups 1,8 --contexts 10

# 5a. the guard's share of score_group at G=8 on policy-sized frames (a stand-in guard: the real guard's computation at these shapes)
step guard_cost 90 bench --workload hacking --cost-arch "$ARCH" --G 8 --size "$SIZE" --cost-repeats 10

# 5b. the differentiable reward at G=8: forward vs forward+backward with and without checkpointing, peak memory
step grad 90 bench --workload grad --arch "$ARCH" --G 8

# 5c. training at the 4B shapes: optimizer steps with gradient checkpointing on and off, pairs/s and peak memory
step train_step 150 bench --workload train-step --arch "$ARCH" --batch-pairs "${TRAIN_PAIRS:-4}" --steps 2

# 5d. cosmos-rl's path: 8 B=1 latent rollouts enqueued and pulled against in-process Wan2.1 decode + score_group
say "step cosmos (limit 150s)"
timeout 150 "$PY" benchmarks/serve_load.py --arch "$ARCH" --cosmos-only --requests 8 --vae "${VAE:-wan}" --latent-size "${LATENT:-60x104}" \
  --cosmos-rounds "${COSMOS_ROUNDS:-1}" --json "$OUT/cosmos.json" >"$OUT/cosmos.txt" 2>>"$LOG"
say "step cosmos: exit $?"

# 5e. the vLLM backend beside nvrm's engine at G=8 and G=64 (candidates/s, MFU, float32 and bf16 drift on the same items).
#     Needs a CUDA vLLM importable there: vllm 0.32.0's wheel alone is 311 MiB and pins torch==2.13.0 (+ flashinfer),
#     so it cannot travel in the 64 MiB carry; the step runs where vLLM is installed and says why it skipped otherwise.
if "$PY" -c "import vllm" >/dev/null 2>&1; then
  step backend_parity 180 bench --workload backend-parity --arch "$ARCH" --G "${PARITY_GS:-8,64}" --n-groups 2 --size "$SIZE" --context-s 10 --fps 8
else
  say "step backend_parity skipped: vllm is not importable on this machine (pip install 'nvrm[vllm]'; see ../shared/notes/gpu.md)"
  echo '{"skipped": "vllm not importable"}' >"$OUT/backend_parity.json"
fi

# 6. CUDA-only tests (pinned memory, attention choice, OOM split on the real allocator, fidelity on the device)
say "step gpu tests"
timeout 60 "$PY" -m pytest -q -m gpu -p no:cacheprovider tests >"$OUT/gpu_tests.txt" 2>&1
say "gpu tests: exit $? ($(tail -1 "$OUT/gpu_tests.txt"))"
# 7. the service at C=32 over binary, batching on vs off (issue 12's GPU targets); last, as it starts
#    three 4B models (in process, two servers): it gets whatever time is left, and its rows are
#    printed as they are measured, so a timeout keeps the finished ones
LEFT=$((510 - SECONDS))
if [ "$LEFT" -gt 60 ]; then
  say "step serve (limit ${LEFT}s)"
  timeout "$LEFT" "$PY" benchmarks/serve_load.py --arch "$ARCH" --concurrency 32 --requests 64 --transports binary --no-shared \
    --json "$OUT/serve.json" >"$OUT/serve.txt" 2>>"$LOG"
  say "step serve: exit $?"
else
  say "step serve skipped: ${LEFT}s left"
fi
say "done"
