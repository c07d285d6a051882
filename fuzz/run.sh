#!/usr/bin/env bash
# Configures and builds the fuzz build (clang, -DDSA_FUZZ=ON), makes the seed corpora, then
# runs every fuzz target (or the ones named) for SECONDS each and prints, per target,
# executions, wall time and the outcome. Exits non-zero if any target crashed, leaked, timed
# out, ran out of memory or allocated more than FUZZ_MALLOC_LIMIT_MB at once.
#
#   fuzz/run.sh [SECONDS] [TARGET...]        SECONDS defaults to 60; CI: 10, campaigns: 600
#
# Environment:
#   DSA_FUZZ_BUILD        build folder (default: build-fuzz in the checkout)
#   DSA_SHARED_DIR        shared fixtures (default: ../shared beside the checkout)
#   DSA_TOKENIZER_DIR     the DeepSeek-V3.2 tokenizer folder (default: $DSA_SHARED_DIR/tokenizer)
#   FUZZ_JOBS             build parallelism (default 2)
#   FUZZ_MALLOC_LIMIT_MB  largest single allocation allowed (default 256; inputs are small)
#   FUZZ_RSS_LIMIT_MB     memory limit per target (default 2048)
#   FUZZ_SKIP_BUILD=1     reuse the build as it is
#
# Everything goes under the build folder: fuzz-seeds/<target> (rebuilt each run),
# fuzz-corpus/<target> (kept, grows from run to run), fuzz-artifacts/<target> (crash-*,
# leak-*, timeout-*, oom-* inputs; rerun one with `BUILD/fuzz/<target> FILE`), fuzz-logs/
# (one log per target: run one run.sh per build folder at a time, or different targets).
set -uo pipefail

# The whole script is one block, read before any of it runs: bash reads a script as it goes,
# and an edit to this file during a long campaign would otherwise change the rest of the run.
{
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"
secs="${1:-60}"
shift || true
build="${DSA_FUZZ_BUILD:-$repo/build-fuzz}"
export DSA_SHARED_DIR="${DSA_SHARED_DIR:-$repo/../shared}"
export DSA_TOKENIZER_DIR="${DSA_TOKENIZER_DIR:-$DSA_SHARED_DIR/tokenizer}"
all=(fuzz_safetensors fuzz_safetensors_index fuzz_config fuzz_tokenizer fuzz_tokenizer_deepseek
     fuzz_dsv32_parser fuzz_dsv32_encoding fuzz_glm5_template fuzz_json_schema fuzz_tool_calls fuzz_regex)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")

dict_of() {
  case "$1" in
    fuzz_safetensors) echo safetensors ;;
    fuzz_safetensors_index) echo safetensors_index ;;
    fuzz_config) echo config ;;
    fuzz_tokenizer) echo tokenizer ;;
    fuzz_tokenizer_deepseek) echo tokenizer_text ;;
    fuzz_dsv32_parser) echo dsv32_parser ;;
    fuzz_dsv32_encoding | fuzz_glm5_template) echo chat ;;
    fuzz_json_schema) echo json_schema ;;
    fuzz_tool_calls) echo tool_calls ;;
    fuzz_regex) echo regex ;;
  esac
}

if [ "${FUZZ_SKIP_BUILD:-0}" != 1 ]; then
  echo "== configure + build ($build)"
  t0=$SECONDS
  # -O1 -g without NDEBUG: nlohmann's and libstdc++'s assertions stay on and catch misuse.
  mkdir -p "$build"
  CC=clang CXX=clang++ cmake -S "$repo" -B "$build" -DDSA_FUZZ=ON -DDSA_WERROR=ON \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
    -DDSA_COMPONENTS="core;io;kernels;model;tokenizer;sampling" >"$build/configure.log" 2>&1 \
    || { cat "$build/configure.log"; echo "configure failed"; exit 1; }
  cmake --build "$build" --target fuzz -j"${FUZZ_JOBS:-2}" || { echo "build failed"; exit 1; }
  echo "   built in $((SECONDS - t0)) s"
fi

echo "== seeds"
"$here/seeds.sh" "$build" "$DSA_SHARED_DIR" || exit 1

mkdir -p "$build/fuzz-logs"
failed=0 passed=0 n_failed=0
printf '\n%-26s %12s %10s %8s  %s\n' target executions exec/s wall result
for t in "${targets[@]}"; do
  bin="$build/fuzz/$t"
  [ -x "$bin" ] || { printf '%-26s %s\n' "$t" "not built"; failed=1; n_failed=$((n_failed + 1)); continue; }
  corpus="$build/fuzz-corpus/$t" art="$build/fuzz-artifacts/$t" log="$build/fuzz-logs/$t.log"
  mkdir -p "$corpus" "$art"
  t0=$SECONDS
  # New inputs go into the first folder (the kept corpus); the seeds are read only.
  "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb="${FUZZ_RSS_LIMIT_MB:-2048}" \
    -malloc_limit_mb="${FUZZ_MALLOC_LIMIT_MB:-256}" -dict="$here/dicts/$(dict_of "$t").dict" \
    -artifact_prefix="$art/" -print_final_stats=1 "$corpus" "$build/fuzz-seeds/$t" >"$log" 2>&1
  rc=$?
  wall=$((SECONDS - t0))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  # libFuzzer exits non-zero on a crash, leak, timeout or out-of-memory, and names the input
  # it saved (other runs sharing the folder may add files of their own).
  if [ $rc -eq 0 ]; then
    result=ok
    passed=$((passed + 1))
  else
    failed=1
    n_failed=$((n_failed + 1))
    kind=$(grep -m1 -oE 'fuzz failure|runtime error|ERROR: (AddressSanitizer|LeakSanitizer): [a-z-]+|ERROR: libFuzzer: [a-z -]+' "$log" || true)
    saved=$(sed -n 's/.*Test unit written to //p' "$log" | tr '\n' ' ')
    result="FAILED (rc $rc${kind:+, $kind}); log $log; input: ${saved:-none saved}"
  fi
  printf '%-26s %12s %10s %7ss  %s\n' "$t" "${execs:-?}" "${rate:-?}" "$wall" "$result"
done
echo "fuzz: $passed passed, $n_failed failed"
exit $failed
}
