#!/bin/sh
# Parallel layouts on this machine: one process against two MPI ranks (one thread each) in each
# layout (--ep 2, --pp 2, --tp 2, --ep 2 --tp 2), interleaved round by round, with the bytes
# each rank reads (`dsa inspect`) and `dsa plan`'s prediction for the same layout, its links
# fitted to this job's own `dsa bench comm` (--comm). One line per layout: medians over the
# rounds. Then batched decode (BATCH sequences, default 16) for one process, --ep 2, --ep 2 --dp
# (data-parallel attention) and --pp 2 (two micro-batches); the planner's
# --replicated-attention is the engine's --ep without --dp.
#
#   bench/mpi_layouts.sh MODEL_DIR [ROUNDS] [DSA]
#
# MODEL_DIR: a v32-mini checkpoint (`dsa make-model --preset v32-mini --out MODEL_DIR`);
# ROUNDS: runs per layout (default 3); DSA: the binary (default build/tools/dsa). Needs
# mpirun (openmpi-bin). On a cluster, add a hostfile and --bind-to numa to MPIRUN.
set -eu
model=${1:?usage: bench/mpi_layouts.sh MODEL_DIR [ROUNDS] [DSA]}
rounds=${2:-3}
dsa=${3:-build/tools/dsa}
MPIRUN=${MPIRUN:-mpirun --allow-run-as-root --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 -np 2}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

field() { sed -n "s/.*\"$1\": *\([-0-9.eE+]*\).*/\1/p" | head -1; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
hidden=$(sed -n 's/.*"hidden_size": *\([0-9]*\).*/\1/p' "$model/config.json")

$MPIRUN "$dsa" bench comm --hidden "$hidden" --tokens 1,4,16,64,128 --json > "$work/comm.json" 2>/dev/null
# A layout's engine flags: --ep 2, --pp 2, --tp 2, or eptp: --ep 2 --tp 2 (the experts split
# whole, attention and the dense and shared MLPs by rows: the planner's --tp 2).
flags() { if [ "$1" = eptp ]; then echo "--ep 2 --tp 2"; else echo "--$1 2"; fi; }
bench="bench --model $model -p 128 -n 32 --repeat 3 --json"
batch=${BATCH:-16}
batched="bench --model $model --batch $batch -p 0 -n 8 --repeat 1 --json"
r=1
while [ "$r" -le "$rounds" ]; do
  "$dsa" $bench 2>/dev/null | tr -d '\n' > "$work/one.$r"
  for l in ep pp tp eptp; do $MPIRUN "$dsa" $bench $(flags $l) 2>/dev/null | tr -d '\n' > "$work/$l.$r"; done
  "$dsa" $batched 2>/dev/null | tr -d '\n' > "$work/bone.$r"
  $MPIRUN "$dsa" $batched --ep 2 2>/dev/null | tr -d '\n' > "$work/bep.$r"
  $MPIRUN "$dsa" $batched --ep 2 --dp 2>/dev/null | tr -d '\n' > "$work/bdp.$r"
  $MPIRUN "$dsa" $batched --pp 2 2>/dev/null | tr -d '\n' > "$work/bpp.$r"
  r=$((r + 1))
done

printf '%-8s %14s %14s %22s %18s\n' layout 'decode tok/s' 'prefill tok/s' 'read per rank' 'plan decode tok/s'
for l in one ep pp tp eptp; do
  d=$(for f in "$work"/$l.*; do field decode_tokens_per_s < "$f"; done | median)
  p=$(for f in "$work"/$l.*; do field prefill_tokens_per_s < "$f"; done | median)
  if [ "$l" = one ]; then
    bytes=$("$dsa" inspect --model "$model" | sed -n 's/^parameters:.*(\([0-9.]* [KMGT]*i*B\) in.*/\1/p')
    plan=$("$dsa" plan --model "$model" --hardware local --batch 1 --input-len 128 --output-len 32 --context 144 --json 2>/dev/null | field tpot_ms)
  else
    bytes=$("$dsa" inspect --model "$model" $(flags $l) | awk '/^  rank/ { printf "%s%s %s", sep, $3, $4; sep = ", " }')
    # The engine's --ep without --dp attends for every sequence on every rank; its --tp alone
    # splits every expert by rows (the planner's --ep 1), with --ep the experts whole.
    case $l in
      ep) opts="--ep 2 --replicated-attention" ;;
      eptp) opts="--tp 2 --ep 2" ;;
      *) opts="--$l 2 --ep 1" ;;
    esac
    plan=$("$dsa" plan --model "$model" --hardware local --comm "$work/comm.json" --devices 2 $opts --batch 1 --input-len 128 \
      --output-len 32 --context 144 --json 2>/dev/null | field tpot_ms)
  fi
  awk -v l="$l" -v d="$d" -v p="$p" -v b="$bytes" -v t="$plan" 'BEGIN { printf "%-8s %14.1f %14.1f %22s %18.1f\n", l, d, p, b, 1000 / t }'
done

echo
printf '%-8s %20s %22s %22s\n' layout "decode x$batch tok/s" 'read per rank' 'plan decode tok/s'
for l in bone bep bdp bpp; do
  d=$(for f in "$work"/$l.*; do field decode_aggregate_tokens_per_s < "$f"; done | median)
  case $l in
    bone) name=one; bytes=$("$dsa" inspect --model "$model" | sed -n 's/^parameters:.*(\([0-9.]* [KMGT]*i*B\) in.*/\1/p'); opts="--devices 1" ;;
    bep) name=ep; bytes=$("$dsa" inspect --model "$model" --ep 2 | awk '/^  rank/ { print $3, $4; exit }')
         opts="--comm $work/comm.json --devices 2 --ep 2 --replicated-attention" ;;
    bdp) name=ep+dp; bytes=$("$dsa" inspect --model "$model" --ep 2 --dp | awk '/^  rank/ { print $3, $4; exit }')
         opts="--comm $work/comm.json --devices 2 --ep 2" ;;
    bpp) name=pp; bytes=$("$dsa" inspect --model "$model" --pp 2 | awk '/^  rank/ { printf "%s%s %s", sep, $3, $4; sep = ", " }')
         opts="--comm $work/comm.json --devices 2 --pp 2 --ep 1" ;;
  esac
  plan=""
  [ -n "$opts" ] && plan=$("$dsa" plan --model "$model" --hardware local $opts --batch "$batch" --input-len 128 --output-len 8 \
    --context 136 --json 2>/dev/null | field tpot_ms)
  awk -v l="$name" -v d="$d" -v b="$bytes" -v t="$plan" -v n="$batch" \
    'BEGIN { printf "%-8s %20.1f %22s %22s\n", l, d, b, t == "" ? "-" : sprintf("%.1f", n * 1000 / t) }'
done
