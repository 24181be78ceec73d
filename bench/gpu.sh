#!/usr/bin/env bash
# The GPU benchmark: run on a machine with one NVIDIA GPU, from a clone, with the machine's own Python and PyTorch
# (nothing is installed, nothing is downloaded; no network needed). At most 8 minutes. Writes bench/results-gpu.json:
# MFU and tokens/s per GPU of the ~350M GPT (bf16), DDP vs FSDP, compile off and on; checkpoint blocking seconds of
# background sharded saves; peak GPU memory.
#   [PYTHON=python3.12] bench/gpu.sh [flags of bench/gpu.py; --device cpu: a dry run on CPU with a tiny model]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export AWS_EC2_METADATA_DISABLED=true  # no metadata service is contacted anyway off a cloud node
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-$(mktemp -d)}"
"$PY" -c 'import torch, numpy; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpu", torch.cuda.is_available())'
exec timeout --kill-after=10 480 "$PY" bench/gpu.py --budget 450 "$@"
