#pragma once
// Small helpers shared by the command files.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "kernels/kernels.h"
#include "runtime/dist.h"
#include "runtime/engine.h"

namespace dsa::cli {

// Integer options: CLI11's range check with the bounds in the message. Bounds keep sums
// such as prompt + generated tokens far from int overflow.
inline CLI::Validator int_in(int64_t lo, int64_t hi) { return CLI::Range(lo, hi); }
inline constexpr int64_t kMaxTokens = int64_t(1) << 24;  // 16M tokens: any context, any prompt

// Floating-point options: CLI::Range lets NaN through (every comparison is false).
inline CLI::Validator finite_in(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& s) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(s, v)) return "expected a number, got '" + s + "'";
        if (!std::isfinite(v) || v < lo || v > hi)
          return "must be a finite number in [" + CLI::detail::to_string(lo) + ", " + CLI::detail::to_string(hi) + "], got " + s;
        return {};
      },
      "NUMBER in [" + CLI::detail::to_string(lo) + " - " + CLI::detail::to_string(hi) + "]");
}

// DSA_MOE_DISPATCH: how data-parallel attention's MoE layers move tokens (RankShard::moe_dispatch).
inline MoeDispatch moe_dispatch_from_env() {
  const char* v = std::getenv("DSA_MOE_DISPATCH");
  if (!v || std::string(v) == "auto") return MoeDispatch::Auto;
  if (std::string(v) == "allgather") return MoeDispatch::AllGather;
  if (std::string(v) == "alltoall") return MoeDispatch::AllToAll;
  throw Error(std::string("DSA_MOE_DISPATCH='") + v + "': expected auto, allgather or alltoall");
}

// Threads: at most four per logical CPU (more only thrashes; 100000 threads would not even
// start). The bound for -t and for OMP_NUM_THREADS.
inline int max_threads() { return std::max(4, 4 * int(std::max(1u, std::thread::hardware_concurrency()))); }
inline CLI::Validator thread_count() { return CLI::Range(1, max_threads()); }

// A seed: decimal digits that fit in 64 bits ("-1" would otherwise wrap to 2^64 - 1 and an
// overlong number saturate, both silently).
inline CLI::Validator seed_value() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        uint64_t v = 0;
        const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (s.empty() || ec != std::errc() || end != s.data() + s.size()) return "expected an integer in [0, 2^64), got '" + s + "'";
        return {};
      },
      "UINT64");
}

// A value that must not be empty (an output path).
inline CLI::Validator non_empty() {
  return CLI::Validator([](std::string& s) -> std::string { return s.empty() ? "must not be empty" : ""; }, "TEXT");
}

// A path that must name an existing regular file (not a directory, FIFO or device).
inline CLI::Validator regular_file() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        std::error_code ec;
        if (!std::filesystem::exists(s, ec)) return "file '" + s + "' does not exist";
        if (!std::filesystem::is_regular_file(s, ec)) return "'" + s + "' is not a regular file";
        return {};
      },
      "FILE");
}

// "a,b,,c" -> {"a", "b", "", "c"}: empty items kept, for the caller to name.
inline std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> v;
  for (size_t i = 0;;) {
    const size_t j = s.find(',', i);
    v.push_back(s.substr(i, j == std::string::npos ? std::string::npos : j - i));
    if (j == std::string::npos) return v;
    i = j + 1;
  }
}

// "1,2,3" -> {1, 2, 3}; one clear error for anything else.
inline std::vector<int32_t> parse_ids(const std::string& s, const std::string& flag) {
  std::vector<int32_t> ids;
  for (const std::string& tok : split_commas(s)) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(tok, &used);
    } catch (...) {
      used = 0;
    }
    if (tok.empty() || used != tok.size() || v < 0 || v > INT32_MAX)
      throw Error(flag + ": expected comma-separated non-negative token ids, got '" + tok + "'");
    ids.push_back(int32_t(v));
  }
  return ids;
}

inline CacheType parse_cache_type(const std::string& s) {
  if (s == "f32") return CacheType::F32;
  if (s == "bf16") return CacheType::BF16;
  if (s == "fp8") return CacheType::FP8;
  if (s == "fp8-656") return CacheType::FP8_656;
  throw Error("--kv-cache: expected f32, bf16, fp8 or fp8-656, got '" + s + "'");
}

// "512M", "8G", "1073741824": bytes, with an optional K/M/G/T suffix (powers of 1024).
inline int64_t parse_bytes(const std::string& s, const std::string& flag) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  double mul = 1;
  if (used > 0 && used + 1 == s.size()) {
    switch (s.back()) {
      case 'K': case 'k': mul = 1024.0; break;
      case 'M': case 'm': mul = 1024.0 * 1024; break;
      case 'G': case 'g': mul = 1024.0 * 1024 * 1024; break;
      case 'T': case 't': mul = 1024.0 * 1024 * 1024 * 1024; break;
      default: used = 0;
    }
    if (used > 0) ++used;
  }
  if (used == 0 || used != s.size() || !(v > 0) || v * mul > 1e18)
    throw Error(flag + ": expected a size in bytes with an optional K, M, G or T suffix (e.g. 8G), got '" + s + "'");
  return int64_t(v * mul);
}

// --cache-mem / --cache-tokens / --block-size: the engine's cache pool.
struct CacheFlags {
  std::string mem;
  int64_t tokens = 0;
  int block_size = 64;
  void add(CLI::App* cmd) {
    cmd->add_option("--block-size", block_size, "Tokens per cache block; prefix-cache hits are whole blocks")
        ->capture_default_str()
        ->check(int_in(1, 1 << 16));
    cmd->add_option("--cache-mem", mem, "KV cache pool size in bytes (K/M/G suffixes; default: what the machine's free memory allows)");
    cmd->add_option("--cache-tokens", tokens, "KV cache pool size in tokens (instead of --cache-mem)")->check(int_in(1, int64_t(1) << 34));
  }
  void apply(EngineOptions& o) const {
    if (!mem.empty() && tokens > 0) throw Error("give one of --cache-mem and --cache-tokens");
    o.block_size = block_size;
    if (!mem.empty()) o.cache_bytes = parse_bytes(mem, "--cache-mem");
    if (tokens > 0) o.cache_tokens = tokens;
  }
};

// --ep / --pp / --tp: the layout of an MPI job (mpirun -np N dsa ...) over its N ranks:
// pp pipeline stages of N / pp ranks, which split the experts (--ep) or the attention
// heads (--tp) or both among themselves. Rank 0 writes the command's output; the other
// ranks compute beside it and stay silent on stdout.
struct ParallelFlags {
  int ep = 1, pp = 1, tp = 1, micro_batches = 0;
  bool dp = false;
  void add(CLI::App* cmd) {
    cmd->add_option("--ep", ep, "Expert-parallel ranks per pipeline stage: each holds 1/EP of the routed experts")
        ->capture_default_str()
        ->check(int_in(1, 4096));
    cmd->add_option("--pp", pp, "Pipeline stages: each holds a contiguous 1/PP of the layers")->capture_default_str()->check(int_in(1, 4096));
    cmd->add_option("--tp", tp, "Tensor-parallel ranks per pipeline stage: each holds 1/TP of the attention heads")
        ->capture_default_str()
        ->check(int_in(1, 4096));
    cmd->add_flag("--dp", dp,
                  "Data-parallel attention with --ep: each rank attends for its own sequences (holding their caches, the dense "
                  "layers and the whole head) and the experts stay split");
    cmd->add_option("--micro-batches", micro_batches,
                    "With --pp: split a step's sequences into at most this many groups that follow each other through the "
                    "stages (default: up to the stage count, from 2 tokens per group)")
        ->check(int_in(1, 4096));
  }
  // Joins the MPI job and checks the layout against it, before any weight is read (the
  // model's own limits are checked by Model::load, also before).
  RankShard shard() const {
    dist::init();
    const int n = dist::size();
    if (n > 1 && ep == 1 && pp == 1 && tp == 1) {
      const std::string k = std::to_string(n);
      throw Error("started as " + k + " MPI processes: say how to split the model over them (--ep " + k + ", --pp " + k + " or --tp " + k + ")");
    }
    RankShard s;
    s.rank = dist::rank();
    s.ranks = n;
    s.ep = ep;
    s.pp = pp;
    s.tp = tp;
    s.dp = dp;
    s.micro_batches = micro_batches;
    const int64_t want = int64_t(pp) * std::max(ep, tp);
    if (n == 1 && want > 1)
      throw Error(s.describe() + ": expected " + std::to_string(want) + " processes, this is 1 outside mpirun (start it as mpirun -np " +
                  std::to_string(want) + " dsa ...)");
    s.validate_layout();
    if (dist::rank() != 0 && !std::freopen("/dev/null", "w", stdout)) throw Error("rank " + std::to_string(dist::rank()) + ": cannot silence stdout");
    if (n > 1) {
      dist::set_stage_size(s.group());
      s.sum = &dist::sum;
      s.sum_f64 = &dist::sum_f64;
      s.gather_columns = &dist::gather_columns;
      s.send = &dist::send;
      s.recv = &dist::recv;
      s.broadcast = &dist::broadcast;
      s.gather_counts = &dist::gather_counts;
      s.gather_rows = &dist::gather_rows;
      s.sum_scatter_rows = &dist::sum_scatter_rows;
      s.exchange_counts = &dist::exchange_counts;
      s.exchange_rows = &dist::exchange_rows;
      s.exchange_rows_f64 = &dist::exchange_rows_f64;
      s.moe_dispatch = moe_dispatch_from_env();
    }
    return s;
  }
};

}  // namespace dsa::cli
