// `dsa run`: one completion, streamed. Text in, text out through the model's tokenizer;
// or, with --ids/--print-ids, token ids in and out for checkpoints without a tokenizer
// (an external contract: stdout is exactly one comma-separated line of generated ids).
#include <chrono>
#include <cstdio>
#include <optional>

#include "cli_util.h"
#include "command.h"
#include "gen_cli.h"
#include "runtime/chat.h"
#include "runtime/generator.h"

namespace {

struct Args {
  std::string model, prompt, ids, kv_cache = "fp8";
  int n = 256, ctx = 0, batch = 512;
  bool print_ids = false, chat = false, thinking = false, ignore_eos = false, mtp = false;
  std::vector<std::string> stop;
  dsa::cli::SamplingFlags sampling;
};

void run(Args& a) {
  using namespace dsa;
  if (a.prompt.empty() == a.ids.empty()) throw Error("give exactly one of -p/--prompt (text) or --ids (token ids)");
  if (!a.ids.empty() && !a.print_ids) throw Error("--ids needs --print-ids (generated ids are printed, not text)");
  // With --print-ids stdout carries only the ids; text is not printed.
  if (!a.ids.empty() && (a.chat || a.thinking || !a.stop.empty()))
    throw Error("--chat, --thinking and --stop work on text: use -p instead of --ids");
  if (a.n < 0) throw Error("-n: expected >= 0, got " + std::to_string(a.n));
  const SamplerParams sp = a.sampling.resolve();

  const auto t0 = std::chrono::steady_clock::now();
  auto model = Model::load(a.model, /*load_mtp=*/a.mtp, /*verbose=*/!a.print_ids);
  const ModelConfig& c = model->config;
  std::optional<Tokenizer> tok;
  std::vector<int32_t> prompt;
  if (!a.ids.empty()) {
    prompt = cli::parse_ids(a.ids, "--ids");
    for (int32_t id : prompt)
      if (id >= c.vocab_size) throw Error("--ids: token id " + std::to_string(id) + " out of range [0, " + std::to_string(c.vocab_size) + ")");
  } else {
    tok.emplace(Tokenizer::from_dir(a.model));
    if (a.chat || a.thinking) {
      nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
      msgs.push_back({{"role", "user"}, {"content", a.prompt}});
      prompt = tok->encode(render_chat_prompt(c.family, msgs, a.thinking));  // the template carries BOS
    } else {
      prompt = tok->encode(a.prompt, tok->default_add_bos());
    }
  }
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  GeneratorOptions go;
  go.max_ctx = a.ctx > 0 ? a.ctx : int(prompt.size()) + std::max(a.n, 1);
  if (c.max_position_embeddings > 0) go.max_ctx = std::min(go.max_ctx, c.max_position_embeddings);
  go.prefill_chunk = a.batch;
  go.cache = cli::parse_cache_type(a.kv_cache);
  go.mtp = a.mtp;
  Generator gen(*model, tok ? &*tok : nullptr, go);

  GenerateOptions g;
  g.max_new_tokens = a.n;
  g.sampling = sp;
  g.stop = a.stop;
  g.stop_on_eos = !a.ignore_eos;
  bool first = true;
  const GenerateResult r = gen.generate(
      prompt, g,
      [&](std::string_view s) {
        if (a.print_ids) return;
        std::fwrite(s.data(), 1, s.size(), stdout);
        std::fflush(stdout);
      },
      [&](int32_t id) {
        if (a.print_ids) {
          std::printf(first ? "%d" : ",%d", id);
          std::fflush(stdout);
          first = false;
        }
        return true;
      });
  std::printf("\n");
  std::fflush(stdout);
  std::fprintf(stderr, "load: %.2f s | prompt: %d tokens, %.1f tok/s | generated: %zu tokens, %.1f tok/s%s | stop: %s\n",
               load_s, r.prompt_tokens, r.prefill_tok_s(), r.tokens.size(), r.decode_tok_s(), cli::mtp_summary(r).c_str(),
               to_string(r.reason));
}

void setup_run(CLI::App& app) {
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("run", "Generate a completion: text in, streamed text out (or ids in, ids out)");
  cmd->add_option("--model", a->model, "Model directory (config.json, safetensors, tokenizer.json)")->required();
  cmd->add_option("-p,--prompt", a->prompt, "Prompt text");
  cmd->add_option("--ids", a->ids, "Prompt as comma-separated token ids (no tokenizer needed; with --print-ids)");
  cmd->add_flag("--print-ids", a->print_ids, "Print the generated ids as one comma-separated line instead of text");
  cmd->add_option("-n,--n-predict", a->n, "Maximum tokens to generate")->capture_default_str()->check(dsa::cli::int_in(0, dsa::cli::kMaxTokens));
  cmd->add_option("--stop", a->stop, "Stop when this text is produced (repeatable; not printed)");
  cmd->add_flag("--chat", a->chat, "Wrap the prompt as one user message in the model's chat encoding");
  cmd->add_flag("--thinking", a->thinking, "Chat encoding in thinking mode (implies --chat)");
  cmd->add_flag("--ignore-eos", a->ignore_eos, "Keep generating past end-of-sequence tokens");
  cmd->add_flag("--mtp", a->mtp, dsa::cli::kMtpHelp);
  cmd->add_option("--ctx", a->ctx, "KV cache size in tokens (default: prompt + n)")->check(dsa::cli::int_in(1, dsa::cli::kMaxTokens));
  cmd->add_option("--batch", a->batch, "Prefill chunk: tokens per forward call")->capture_default_str()->check(dsa::cli::int_in(1, dsa::cli::kMaxTokens));
  cmd->add_option("--kv-cache", a->kv_cache, "f32, bf16, fp8 or fp8-656")->capture_default_str();
  a->sampling.add(cmd);
  cmd->callback([a] { run(*a); });
}

}  // namespace

DSA_COMMAND(10, setup_run);
