#pragma once
// Encode throughput of the tokenizer on one core, for `dsa bench tokenizer`.
#include <string>

namespace dsa {

class Tokenizer;

struct TokenizerBench {
  double mb_per_s = 0;        // steady state: best of the repeats (word cache warm)
  double first_mb_per_s = 0;  // first pass (word cache cold)
  size_t bytes = 0;
  size_t tokens = 0;
};

// Encodes `text` `repeats` times on the calling thread; rates are per CPU-second of that thread.
TokenizerBench bench_tokenizer(const Tokenizer& tok, const std::string& text, int repeats);
double bench_tokenizer_mb_per_s(const Tokenizer& tok, const std::string& text, int repeats);

// A built-in ~1 MB mix of English prose, source code, JSON, numbers, CJK and emoji, with
// varied words so the word cache does not see one sentence over and over.
std::string builtin_bench_text(size_t target_bytes = 1 << 20);

}  // namespace dsa
