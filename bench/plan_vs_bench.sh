#!/bin/sh
# `dsa plan` against `dsa bench` on the benchmark model: interleaved pairs of the two commands
# (each plan re-measures this machine with the `local` profile), decode at depths 0, 4096 and
# 16384, prefill of 512 tokens at depth 0 and aggregate decode of 4, 16 and 64 sequences stepping
# together at depth 0, one line per pair with the plan's error.
#
#   bench/plan_vs_bench.sh MODEL_DIR [ROUNDS] [DSA]
#
# MODEL_DIR: a v32-mini checkpoint (`dsa make-model --preset v32-mini --out MODEL_DIR`);
# ROUNDS: pairs per quantity (default 4); DSA: the binary (default build/tools/dsa).
# Run it on an otherwise idle machine: the two commands of a pair run a few seconds apart,
# and a shared machine's bandwidth moves between them.
set -eu
model=${1:?usage: bench/plan_vs_bench.sh MODEL_DIR [ROUNDS] [DSA]}
rounds=${2:-4}
dsa=${3:-build/tools/dsa}

# The value of a top-level number field of a one-line JSON object.
field() { sed -n "s/.*\"$1\": *\([-0-9.eE+]*\).*/\1/p"; }

printf '%-22s %12s %12s %8s\n' quantity 'bench tok/s' 'plan tok/s' error
r=1
while [ "$r" -le "$rounds" ]; do
  for depth in 0 4096 16384; do
    if [ "$depth" -eq 16384 ]; then p=0; n=32; else p=512; n=64; fi
    b=$("$dsa" bench --model "$model" -p "$p" -n "$n" --depth "$depth" --repeat 3 --json 2>/dev/null)
    q=$("$dsa" plan --model "$model" --hardware local --batch 1 --input-len 512 --output-len 64 --context "$depth" --json 2>/dev/null)
    bd=$(printf '%s' "$b" | field decode_tokens_per_s)
    qd=$(printf '%s' "$q" | field decode_tokens_per_s_per_device)
    awk -v q="decode, depth $depth" -v b="$bd" -v p="$qd" 'BEGIN { printf "%-22s %12.1f %12.1f %+7.0f%%\n", q, b, p, 100 * (p / b - 1) }'
    if [ "$depth" -eq 0 ]; then
      bp=$(printf '%s' "$b" | field prefill_tokens_per_s)
      qp=$(printf '%s' "$q" | field prefill_tokens_per_s_per_device)
      awk -v q="prefill 512, depth 0" -v b="$bp" -v p="$qp" 'BEGIN { printf "%-22s %12.1f %12.1f %+7.0f%%\n", q, b, p, 100 * (p / b - 1) }'
    fi
  done
  for batch in 4 16 64; do
    b=$("$dsa" bench --model "$model" --batch "$batch" -p 0 -n 16 --repeat 2 --json 2>/dev/null)
    q=$("$dsa" plan --model "$model" --hardware local --batch "$batch" --input-len 512 --output-len 64 --context 0 --json 2>/dev/null)
    bd=$(printf '%s' "$b" | field decode_aggregate_tokens_per_s)
    qd=$(printf '%s' "$q" | field decode_tokens_per_s_per_device)
    awk -v q="decode x$batch, depth 0" -v b="$bd" -v p="$qd" 'BEGIN { printf "%-22s %12.1f %12.1f %+7.0f%%\n", q, b, p, 100 * (p / b - 1) }'
  done
  r=$((r + 1))
done
