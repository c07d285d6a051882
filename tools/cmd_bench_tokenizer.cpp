// `dsa bench tokenizer --model DIR [-f FILE]`: encode throughput on one core.
#include <cstdio>
#include <memory>
#include <string>

#include "cli_util.h"
#include "command.h"
#include "core/error.h"
#include "core/mmap_file.h"
#include "tokenizer/bench.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace {

struct Args {
  std::string model, file;
  int repeats = 5;
};

void run(const Args& a) {
  const dsa::Tokenizer tok = dsa::Tokenizer::from_dir(a.model);
  std::string text;
  if (!a.file.empty()) {
    text = dsa::read_text_file(a.file, "-f text", size_t(1) << 30);
    if (!dsa::utf8::valid(text)) throw dsa::Error(a.file + " is not valid UTF-8");
  } else {
    text = dsa::builtin_bench_text();
  }
  const dsa::TokenizerBench r = dsa::bench_tokenizer(tok, text, a.repeats);
  std::printf("text: %s, %zu bytes -> %zu tokens (%.2f bytes/token)\n",
              a.file.empty() ? "built-in mix" : a.file.c_str(), r.bytes, r.tokens,
              r.tokens ? static_cast<double>(r.bytes) / static_cast<double>(r.tokens) : 0.0);
  std::printf("encode, 1 thread: %.2f MB/s per CPU-second (first pass, cold word cache: %.2f MB/s)\n", r.mb_per_s, r.first_mb_per_s);
}

void setup_bench_tokenizer(CLI::App& app) {
  auto a = std::make_shared<Args>();
  // A subcommand of `dsa bench` (registered after it).
  auto* cmd = app.get_subcommand("bench")->add_subcommand("tokenizer", "Measure tokenizer encode throughput (MB/s, one core)");
  cmd->add_option("--model", a->model, "Directory with tokenizer.json")->required();
  cmd->add_option("-f,--file", a->file, "UTF-8 text to encode (default: a built-in English/code/CJK/emoji mix)")->check(dsa::cli::regular_file());
  cmd->add_option("--repeats", a->repeats, "Timed passes; the best is reported")->capture_default_str()->check(dsa::cli::int_in(1, 1000000));
  cmd->callback([a] { run(*a); });
}

}  // namespace

DSA_COMMAND(71, setup_bench_tokenizer);
