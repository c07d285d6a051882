#include "tokenizer/bench.h"

#include <cstdint>
#include <ctime>

#include "tokenizer/tokenizer.h"

namespace dsa {

namespace {

// CPU time of the calling thread: the "one core" figure stays meaningful on a loaded machine
// where wall time would also count time spent waiting for the core.
double thread_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace

TokenizerBench bench_tokenizer(const Tokenizer& tok, const std::string& text, int repeats) {
  TokenizerBench r;
  r.bytes = text.size();
  if (repeats < 1) repeats = 1;
  double best = 0;
  for (int k = 0; k < repeats; ++k) {
    const double t0 = thread_seconds();
    const auto ids = tok.encode(text);
    const double s = thread_seconds() - t0;
    const double mbs = s > 0 ? static_cast<double>(text.size()) / 1e6 / s : 0;
    if (k == 0) { r.first_mb_per_s = mbs; r.tokens = ids.size(); }
    if (mbs > best) best = mbs;
  }
  r.mb_per_s = best;
  return r;
}

double bench_tokenizer_mb_per_s(const Tokenizer& tok, const std::string& text, int repeats) {
  return bench_tokenizer(tok, text, repeats).mb_per_s;
}

std::string builtin_bench_text(size_t target_bytes) {
  static const char* const kWords[] = {
      "the", "model", "attention", "sparse", "indexer", "token", "cache", "latent", "expert",
      "routing", "quantized", "block", "scale", "throughput", "latency", "kernel", "memory",
      "bandwidth", "prefill", "decode", "sampling", "temperature", "probability", "vector",
      "matrix", "multiply", "accumulate", "normalization", "residual", "embedding", "vocabulary",
      "Paris", "Tokyo", "Berlin", "DeepSeek", "GLM", "inference", "engine", "server", "request"};
  static const char* const kSnippets[] = {
      "for (int i = 0; i < n; ++i) {\n    acc += a[i] * b[i];\n}\n",
      "def softmax(x):\n    m = max(x)\n    e = [math.exp(v - m) for v in x]\n    return [v / sum(e) for v in e]\n",
      "{\"role\": \"user\", \"content\": \"What's the weather in Paris?\", \"id\": 12345}\n",
      "人工智能模型的推理速度取决于内存带宽和计算能力。",
      "東京の天気は晴れです。明日は雨が降るでしょう。",
      "오늘 날씨가 정말 좋네요. ",
      "Привет, как дела? ",
      "🚀🔥 done ✅ 👍🏽 ",
      "x = 3.14159 * r**2; y = 2.71828e-5; n = 1234567890\n",
      "  \t  trailing spaces and\ttabs\r\n",
  };
  std::string out;
  out.reserve(target_bytes + 256);
  uint64_t state = 0x9E3779B97F4A7C15ULL;  // fixed seed: the same text on every run
  auto rnd = [&state](uint64_t n) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state % n;
  };
  constexpr size_t nw = sizeof(kWords) / sizeof(kWords[0]);
  constexpr size_t ns = sizeof(kSnippets) / sizeof(kSnippets[0]);
  while (out.size() < target_bytes) {
    const size_t len = 8 + rnd(16);
    for (size_t k = 0; k < len; ++k) {
      if (k) out += ' ';
      std::string w = kWords[rnd(nw)];
      if (rnd(8) == 0) w[0] = static_cast<char>(w[0] & ~0x20);
      if (rnd(6) == 0) w += std::to_string(rnd(100000));
      out += w;
    }
    out += rnd(4) == 0 ? ".\n\n" : ". ";
    if (rnd(3) == 0) out += kSnippets[rnd(ns)];
  }
  return out;
}

}  // namespace dsa
