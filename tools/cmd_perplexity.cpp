// `dsa perplexity`: PPL of a text file, llama.cpp style (windows of --ctx tokens, the
// second half of each scored; see runtime/perplexity.h), with its standard error.
#include <chrono>
#include <cmath>
#include <cstdio>

#include "cli_util.h"
#include "command.h"
#include "core/mmap_file.h"
#include "runtime/perplexity.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace {

struct Args {
  std::string model, file, kv_cache = "fp8";
  int ctx = 512, batch = 512;
  bool score_all = false;
};

void run(const Args& a) {
  using namespace dsa;
  const std::string text = read_text_file(a.file, "-f text", size_t(1) << 30);
  if (!utf8::valid(text)) throw Error("-f: '" + a.file + "' is not valid UTF-8");
  auto model = Model::load(a.model, /*load_mtp=*/false, /*verbose=*/true);
  const Tokenizer tok = Tokenizer::from_dir(a.model);
  const std::vector<int32_t> ids = tok.encode(text);

  PerplexityOptions o;
  o.ctx = a.ctx;
  o.score_all = a.score_all;
  o.bos_id = tok.default_add_bos() ? tok.bos_id() : -1;
  o.max_tokens = a.batch;
  o.cache = cli::parse_cache_type(a.kv_cache);
  std::fprintf(stderr, "%zu tokens, %zu windows of %d, scoring %s of each\n", ids.size(), ids.size() / size_t(std::max(a.ctx, 1)),
               a.ctx, a.score_all ? "every position" : "the second half");
  const auto t0 = std::chrono::steady_clock::now();
  const PerplexityResult r = perplexity(*model, ids, o, [&](int done, int total, double ppl) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "\r[%d/%d] ppl %.4f, %.1f tok/s", done, total, ppl, double(done) * a.ctx / s);
    std::fflush(stderr);
  });
  std::fprintf(stderr, "\n");
  if (r.n_scored == 0)
    throw Error("perplexity: no token was scored (--ctx " + std::to_string(a.ctx) + " scores " +
                (a.score_all ? "every position" : "the second half") + " of each window after the first token; use a larger --ctx or --score-all)");
  if (!std::isfinite(r.ppl)) throw Error("perplexity: the result is not finite (the model produced NaN or infinite logits)");
  std::printf("perplexity: %.4f ± %.4f (%lld tokens scored, mean NLL %.4f)\n", r.ppl, r.ppl_stderr,
              static_cast<long long>(r.n_scored), r.mean_nll);
}

void setup_perplexity(CLI::App& app) {
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("perplexity", "Perplexity of a text file (llama.cpp windows), with its standard error");
  cmd->add_option("--model", a->model, "Model directory (config.json, safetensors, tokenizer.json)")->required();
  cmd->add_option("-f,--file", a->file, "Text file")->required()->check(dsa::cli::regular_file());
  cmd->add_option("--ctx", a->ctx, "Window size in tokens")->capture_default_str()->check(dsa::cli::int_in(2, dsa::cli::kMaxTokens));
  cmd->add_flag("--score-all", a->score_all, "Score every position of a window, not only the second half");
  cmd->add_option("--batch", a->batch, "Tokens per forward call within a window")->capture_default_str()->check(dsa::cli::int_in(1, dsa::cli::kMaxTokens));
  cmd->add_option("--kv-cache", a->kv_cache, "f32, bf16, fp8 or fp8-656")->capture_default_str();
  cmd->callback([a] { run(*a); });
}

}  // namespace

DSA_COMMAND(50, setup_perplexity);
