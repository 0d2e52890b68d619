#!/usr/bin/env bash
# Reproduces the issue-7 "every suite" budget tables in docs/benchmarks.md on SmolLM2:
# n-gram with fixed K and adaptive (k_max = K) for K = 4, 8, 16, 32 on code, prose, math
# and longdoc, auto on every suite (with mlx-lm's plain decoding as the hot-loop check), then the trained MTP head with confidence (k = K, p_min 0.6) vs fixed K.
# Needs the head from `specpipe-train-drafter model=smollm2-135m` for the second part.
# About 25 minutes on the 2-core VM; run it on an otherwise idle machine.
set -euo pipefail
OUT=${1:-outputs/measure-budget-suites}
COMMON=(limit=3 max_tokens=64 anchor=false)

specpipe-bench -m suite=math,longdoc budget=fixed budget.k=4,8,16,32 "${COMMON[@]}" hydra.sweep.dir="$OUT/ngram-fixed"
specpipe-bench -m suite=code,prose,math,longdoc budget=adaptive budget.k=4 budget.k_max=4,8,16,32 "${COMMON[@]}" \
  hydra.sweep.dir="$OUT/ngram-adaptive"
specpipe-bench -m suite=code,prose,math,longdoc budget=auto limit=4 max_tokens=64 anchor=true hydra.sweep.dir="$OUT/ngram-auto"
specpipe-bench -m suite=code,prose,math,longdoc draft=mtp budget=confidence,fixed budget.k=4,8,16,32 limit=2 max_tokens=64 anchor=false \
  hydra.sweep.dir="$OUT/mtp-confidence"
for d in ngram-fixed ngram-adaptive ngram-auto mtp-confidence; do specpipe-bench-report "$OUT/$d"; done
