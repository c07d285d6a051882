// `dsa chat`: an interactive conversation. Each user line is added to the history, the
// whole conversation is rendered with the model's chat encoding, and only the part of
// the prompt that is not already in the KV cache is prefilled. /reset clears the
// history, /exit (or end of input) quits.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <string_view>

#include "command.h"
#include "cli_util.h"
#include "gen_cli.h"
#include "runtime/chat.h"

namespace {

struct Args {
  std::string model, system, kv_cache = "fp8";
  int n = 512, ctx = 4096, batch = 512;
  bool thinking = false, mtp = false;
  dsa::cli::SamplingFlags sampling;
  dsa::cli::CacheFlags cache;
};

void run(Args& a) {
  using namespace dsa;
  if (a.n < 1) throw Error("-n: expected >= 1, got " + std::to_string(a.n));
  const SamplerParams sp = a.sampling.resolve();
  const auto t0 = std::chrono::steady_clock::now();
  auto model = Model::load(a.model, /*load_mtp=*/a.mtp, /*verbose=*/true);
  const Tokenizer tok = Tokenizer::from_dir(a.model);
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  EngineOptions eo;
  eo.cache = cli::parse_cache_type(a.kv_cache);
  eo.max_ctx = a.ctx;
  if (model->config.max_position_embeddings > 0) eo.max_ctx = std::min(eo.max_ctx, model->config.max_position_embeddings);
  eo.max_seqs = 1;
  eo.max_step_tokens = std::max(2, std::min(a.batch, eo.max_ctx));  // a speculative step verifies two
  eo.mtp = a.mtp;
  // The conversation so far, and room for the next turn's prompt while the previous one's
  // blocks are still cached: twice the context unless told otherwise.
  if (a.cache.mem.empty() && a.cache.tokens == 0) eo.cache_tokens = 2 * int64_t(eo.max_ctx);
  a.cache.apply(eo);
  Engine engine(*model, eo);
  std::fprintf(stderr, "%s\n", engine.capacity().describe().c_str());
  GeneratorOptions go;
  go.prefill_chunk = a.batch;
  go.mtp = a.mtp;
  Generator gen(engine, &tok, go);
  ChatSession chat(gen, tok, a.thinking, a.system);
  GenerateOptions g;
  g.max_new_tokens = a.n;
  g.sampling = sp;

  const bool tty_in = ::isatty(0), tty_out = ::isatty(1);
  std::fprintf(stderr, "load: %.2f s | context %d tokens | /reset clears the conversation, /exit quits\n", load_s, eo.max_ctx);
  std::string line;
  for (;;) {
    if (tty_in) {
      std::printf("> ");
      std::fflush(stdout);
    }
    if (!std::getline(std::cin, line) || line == "/exit") break;
    if (line == "/reset") {
      chat.reset();
      std::fprintf(stderr, "[conversation cleared]\n");
      continue;
    }
    if (line.empty()) continue;
    // Reasoning is dimmed on a terminal, and marked with a prefix when piped.
    bool in_reasoning = false;
    auto on_piece = [&](bool reasoning, std::string_view s) {
      if (reasoning && !in_reasoning) std::fputs(tty_out ? "\x1b[2m" : "[thinking] ", stdout);
      if (!reasoning && in_reasoning) std::fputs(tty_out ? "\x1b[0m\n" : "\n[answer] ", stdout);
      in_reasoning = reasoning;
      std::fwrite(s.data(), 1, s.size(), stdout);
      std::fflush(stdout);
    };
    try {
      const auto t = chat.send(line, g, on_piece);
      if (in_reasoning && tty_out) std::fputs("\x1b[0m", stdout);
      std::printf("\n");
      std::fflush(stdout);
      const auto& r = t.result;
      std::fprintf(stderr, "[prompt: %d tokens (%d reused), %.1f tok/s | reply: %zu tokens, %.1f tok/s%s | stop: %s]\n",
                   r.prompt_tokens, r.reused_tokens, r.prefill_tok_s(), r.tokens.size(), r.decode_tok_s(),
                   cli::mtp_summary(r).c_str(), to_string(r.reason));
      if (r.reason == StopReason::ContextFull) std::fprintf(stderr, "[the context is full: /reset to start over]\n");
    } catch (const Error& e) {
      std::printf("\n");
      // The turn is dropped; the conversation stays usable (a too-long turn, or a full context).
      std::fprintf(stderr, "error: %s%s\n", e.what(),
                   std::string_view(e.what()).find("exceeds the context") != std::string_view::npos ? " (/reset to start over)" : "");
    }
  }
}

void setup_chat(CLI::App& app) {
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("chat", "Interactive chat: user lines from stdin, replies streamed (/reset, /exit)");
  cmd->add_option("--model", a->model, "Model directory (config.json, safetensors, tokenizer.json)")->required();
  cmd->add_flag("--thinking", a->thinking, "Thinking mode: the model reasons first (shown dimmed)");
  cmd->add_option("--system", a->system, "System prompt");
  cmd->add_flag("--mtp", a->mtp, dsa::cli::kMtpHelp);
  cmd->add_option("-n,--n-predict", a->n, "Maximum tokens per reply")->capture_default_str()->check(dsa::cli::int_in(1, dsa::cli::kMaxTokens));
  cmd->add_option("--ctx", a->ctx, "KV cache size in tokens (the whole conversation)")->capture_default_str()->check(dsa::cli::int_in(1, dsa::cli::kMaxTokens));
  a->cache.add(cmd);
  cmd->add_option("--batch", a->batch, "Prefill chunk: tokens per forward step")->capture_default_str()->check(dsa::cli::int_in(1, dsa::cli::kMaxTokens));
  cmd->add_option("--kv-cache", a->kv_cache, "f32, bf16, fp8 or fp8-656")->capture_default_str();
  a->sampling.add(cmd);
  cmd->callback([a] { run(*a); });
}

}  // namespace

DSA_COMMAND(12, setup_chat);
