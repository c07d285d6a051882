#!/usr/bin/env bash
# Serving benchmark, dsa serve against llama.cpp's llama-server on the same shapes, runs
# interleaved (dsa, llama, dsa, llama, ...) at each concurrency; one JSON line per run
# from bench/serve.mjs. Needs the model from `dsa make-model --preset v32-mini`, the anchor's
# llama-server and its Q8_0 GGUF (../shared/anchors/llama.cpp/README.md says how to build them).
#   bench/serve.sh MODEL_DIR GGUF LLAMA_SERVER [CONCURRENCIES] [MAX_TOKENS] [PROMPT_TOKENS]
set -euo pipefail
cd "$(dirname "$0")/.."
model=$1 gguf=$2 llama=$3
levels=${4:-"1 4 16 64"} T=${5:-64} P=${6:-128}
maxc=64; for c in $levels; do [ "$c" -gt "$maxc" ] && maxc=$c; done
ctx=$((P + T + 16))
dsa_port=18181 llama_port=18182
./build/tools/dsa serve --model "$model" --port $dsa_port --ctx 4096 --max-seqs "$maxc" --max-batch-tokens 512 2>/tmp/dsa_serve_bench.log &
dsa_pid=$!
# --threads-http: llama-server's HTTP pool must hold every client's connection; with its
# default, some of 64 streaming clients were dropped ("other side closed").
"$llama" -m "$gguf" --port $llama_port -t 2 --parallel "$maxc" --threads-http $((maxc + 8)) -c $((ctx * maxc)) >/tmp/llama_server_bench.log 2>&1 &
llama_pid=$!
# Wait for both to exit: a server still shutting down would hold its port and answer the
# next run's health check.
trap 'kill $dsa_pid $llama_pid 2>/dev/null || true; wait $dsa_pid $llama_pid 2>/dev/null || true' EXIT
for port in $dsa_port $llama_port; do
  until curl -sf http://127.0.0.1:$port/health >/dev/null; do sleep 1; done
done
vocab=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab_size'])" "$model/config.json")
for c in $levels; do
  n=$((c < 4 ? 8 : 2 * c))
  for port in $dsa_port $llama_port; do
    label=$([ $port = $dsa_port ] && echo dsa || echo llama-server)
    node bench/serve.mjs --url http://127.0.0.1:$port --concurrency "$c" --requests $n --max-tokens "$T" \
      --prompt-tokens "$P" --vocab "$vocab" --label $label
  done
done
node bench/serve.mjs --url http://127.0.0.1:$dsa_port --prefix-ttft 2048 --vocab "$vocab" --label dsa
