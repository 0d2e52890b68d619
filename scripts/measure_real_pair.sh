#!/usr/bin/env bash
# Reproduces the issue-7 real-pair figures in docs/benchmarks.md: Qwen2.5-Coder-1.5B
# target on the code suite (4 edits + 1 write) with the 0.5B draft (budget=auto, and
# mlx-lm's num_draft_tokens swept in the same run) and with n-gram (auto, fixed K=16),
# then the 1.5B's T(n)/T(1) curves without OpenBLAS and per precision.
# About 50 minutes on the 2-core VM; run it on an otherwise idle machine.
set -euo pipefail
OUT=${1:-outputs/measure-real-pair}
mkdir -p "$OUT/calibration"
COMMON=(model=qwen2.5-coder-1.5b suite=code limit=5 max_tokens=64)

specpipe-bench "${COMMON[@]}" draft=model draft.model=qwen2.5-coder-0.5b budget=auto anchor_ks=[4,8,16] \
  results="$OUT/bench.jsonl" hydra.run.dir="$OUT/model-auto"
specpipe-bench "${COMMON[@]}" draft=ngram budget=auto anchor=false results="$OUT/bench.jsonl" hydra.run.dir="$OUT/ngram-auto"
specpipe-bench "${COMMON[@]}" draft=ngram budget=fixed budget.k=16 anchor=false results="$OUT/bench.jsonl" \
  hydra.run.dir="$OUT/ngram-k16"
specpipe-bench-report "$OUT/bench.jsonl"

cal() { # name, overrides...
  local name=$1; shift
  specpipe-calibrate model=qwen2.5-coder-1.5b draft=none +quick=true "$@" hydra.run.dir="$OUT/calibration/$name" \
    | tee "$OUT/calibration/$name.txt"
}
SPECPIPE_BLAS=none cal qwen1.5b-float32-reference quant=float32
cal qwen1.5b-bfloat16 quant=bfloat16
cal qwen1.5b-mlx4 quant=mlx4
