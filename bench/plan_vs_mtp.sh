#!/bin/sh
# `dsa plan --mtp 1` against the engine's speculative decoding (`dsa run --mtp`): interleaved
# pairs of the two commands, plain decode and MTP decode, one line per pair with the plan's
# error. Random weights accept no draft, so the MTP pairs compare a step's cost at
# acceptance 0 (the main model verifying two tokens, then the MTP layer's draft).
#
#   bench/plan_vs_mtp.sh MODEL_DIR [ROUNDS] [DSA]
#
# MODEL_DIR: the benchmark shape with an MTP layer (`dsa make-model --preset v32-mini
# --config-patch '{"num_nextn_predict_layers": 1}' --out MODEL_DIR`); ROUNDS: pairs per
# quantity (default 3); DSA: the binary (default build/tools/dsa). Run it on an otherwise
# idle machine.
set -eu
model=${1:?usage: bench/plan_vs_mtp.sh MODEL_DIR [ROUNDS] [DSA]}
rounds=${2:-3}
dsa=${3:-build/tools/dsa}

printf '%-22s %12s %12s %8s\n' quantity 'run tok/s' 'plan tok/s' error
r=1
while [ "$r" -le "$rounds" ]; do
  for mode in plain mtp; do
    if [ "$mode" = mtp ]; then run_flag=--mtp; plan_flags="--mtp 1 --acceptance 0"; else run_flag=; plan_flags=; fi
    # The run's statistics line (stderr): "generated: 64 tokens, X tok/s".
    e=$("$dsa" run --model "$model" --ids 3,1,4,1,5,9,2,6 --print-ids -n 64 --greedy --ignore-eos $run_flag 2>&1 >/dev/null |
      sed -n 's/.*generated: [0-9]* tokens, \([0-9.]*\) tok\/s.*/\1/p')
    p=$("$dsa" plan --model "$model" --hardware local --batch 1 --input-len 8 --output-len 64 $plan_flags --json 2>/dev/null |
      sed -n 's/.*"decode_tokens_per_s_per_device": *\([-0-9.eE+]*\).*/\1/p')
    awk -v q="decode, $mode" -v b="$e" -v p="$p" 'BEGIN { printf "%-22s %12.1f %12.1f %+7.0f%%\n", q, b, p, 100 * (p / b - 1) }'
  done
  r=$((r + 1))
done
