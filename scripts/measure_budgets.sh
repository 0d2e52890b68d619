#!/usr/bin/env bash
# Reproduces the issue-7 figures in docs/benchmarks.md on this machine:
# T(n)/T(1) curves (with / without the optimised BLAS, per precision) and the
# budget comparison on the code and prose suites. Takes ~40 minutes on 2 cores.
set -euo pipefail
OUT=${1:-outputs/measure-budgets}
mkdir -p "$OUT"

cal() { # name, overrides...
  local name=$1; shift
  specpipe-calibrate "$@" hydra.run.dir="$OUT/calibration/$name" | tee "$OUT/calibration/$name.txt"
}
mkdir -p "$OUT/calibration"
cal smollm2-float32-openblas model=smollm2-135m quant=float32
SPECPIPE_BLAS=none cal smollm2-float32-reference model=smollm2-135m quant=float32 +quick=true
cal smollm2-stored-q4 model=smollm2-135m quant=stored +quick=true
cal smollm2-bfloat16 model=smollm2-135m quant=bfloat16 +quick=true
cal qwen1.5b-float32-openblas model=qwen2.5-coder-1.5b quant=float32 +quick=true draft=model draft.model=qwen2.5-coder-0.5b

# budgets on SmolLM2 + n-gram: fixed K sweep, adaptive, auto; code and prose
specpipe-bench -m suite=code,prose budget=fixed budget.k=4,8,16,32 limit=4 max_tokens=64 anchor=false \
  hydra.sweep.dir="$OUT/fixed"
specpipe-bench -m suite=code,prose budget=adaptive,auto limit=4 max_tokens=64 anchor=true \
  hydra.sweep.dir="$OUT/adaptive-auto"
specpipe-bench-report "$OUT/fixed"
specpipe-bench-report "$OUT/adaptive-auto"

# confidence (needs a drafter with probabilities: layer skip) vs fixed, and the real pair with auto
specpipe-bench -m suite=code,prose draft=layerskip draft.depth=20 budget=confidence,fixed budget.k=8 limit=4 max_tokens=64 anchor=false \
  hydra.sweep.dir="$OUT/confidence"
specpipe-bench-report "$OUT/confidence"
specpipe-bench preset=real-pair suite=code budget=fixed budget.k=4 limit=2 max_tokens=48 results="$OUT/real-pair/bench.jsonl" \
  hydra.run.dir="$OUT/real-pair/fixed"
specpipe-bench preset=real-pair suite=code budget=auto limit=2 max_tokens=48 results="$OUT/real-pair/bench.jsonl" \
  hydra.run.dir="$OUT/real-pair/auto"
specpipe-bench-report "$OUT/real-pair"
