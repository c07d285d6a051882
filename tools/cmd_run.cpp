// `dsa run`: one completion, streamed. Text in, text out through the model's tokenizer;
// or, with --ids/--print-ids, token ids in and out for checkpoints without a tokenizer
// (an external contract: stdout is exactly one comma-separated line of generated ids).
// With --prompts FILE, one prompt per line through the engine, up to --parallel sequences
// stepping together, one result line per prompt in input order (also a contract).
#include <chrono>
#include <cstdio>
#include <fstream>
#include <optional>

#include "cli_util.h"
#include "command.h"
#include "gen_cli.h"
#include "runtime/chat.h"
#include "runtime/generator.h"
#include "runtime/parallel.h"

namespace {

struct Args {
  std::string model, prompt, ids, prompts, kv_cache = "fp8";
  int n = 256, ctx = 0, batch = 512, parallel = 0;
  bool print_ids = false, chat = false, thinking = false, ignore_eos = false, mtp = false;
  dsa::cli::ParallelFlags par;
  std::vector<std::string> stop;
  dsa::cli::SamplingFlags sampling;
  dsa::cli::CacheFlags cache;
};

// The prompt as token ids: ids as given, or the text encoded (in the chat template with
// --chat / --thinking).
std::vector<int32_t> encode_prompt(const Args& a, const dsa::ModelConfig& c, const dsa::Tokenizer* tok, const std::string& text,
                                   const std::string& what) {
  using namespace dsa;
  if (!tok) {
    std::vector<int32_t> ids = cli::parse_ids(text, what);
    for (int32_t id : ids)
      if (id >= c.vocab_size) throw Error(what + ": token id " + std::to_string(id) + " out of range [0, " + std::to_string(c.vocab_size) + ")");
    return ids;
  }
  if (a.chat || a.thinking) {
    nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
    msgs.push_back({{"role", "user"}, {"content", text}});
    return tok->encode(render_chat_prompt(c.family, msgs, a.thinking));  // the template carries BOS
  }
  return tok->encode(text, tok->default_add_bos());
}

// --prompts: one prompt per line, a JSON string (text) or comma-separated ids (--print-ids
// without a tokenizer); blank lines are skipped. Each prompt comes with its line number, which
// errors name.
struct PromptLine {
  int line;
  std::string text;
};
std::vector<PromptLine> read_prompt_lines(const Args& a, bool text) {
  using namespace dsa;
  std::ifstream in(a.prompts);
  if (!in) throw Error("--prompts: cannot read '" + a.prompts + "'");
  std::vector<PromptLine> out;
  std::string line;
  for (int no = 1; std::getline(in, line); ++no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (!text) {
      out.push_back({no, line});
      continue;
    }
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception&) {
      throw Error("--prompts: line " + std::to_string(no) + " of '" + a.prompts + "' is not a JSON string");
    }
    if (!j.is_string()) throw Error("--prompts: line " + std::to_string(no) + " of '" + a.prompts + "' is not a JSON string");
    out.push_back({no, j.get<std::string>()});
  }
  if (out.empty()) throw Error("--prompts: '" + a.prompts + "' holds no prompt");
  return out;
}

// The prompts of --prompts as token ids; errors name the file and the line.
std::vector<std::vector<int32_t>> encode_prompt_file(const Args& a, const dsa::ModelConfig& c, const dsa::Tokenizer* tok) {
  std::vector<std::vector<int32_t>> prompts;
  for (const PromptLine& p : read_prompt_lines(a, tok != nullptr))
    prompts.push_back(encode_prompt(a, c, tok, p.text, "--prompts: line " + std::to_string(p.line) + " of '" + a.prompts + "'"));
  return prompts;
}

dsa::GenerateOptions generate_options(const Args& a, const dsa::SamplerParams& sp) {
  dsa::GenerateOptions g;
  g.max_new_tokens = a.n;
  g.sampling = sp;
  g.stop = a.stop;
  g.stop_on_eos = !a.ignore_eos;
  return g;
}

void run_prompts(const Args& a, const dsa::Model& model, const dsa::Tokenizer* tok, const dsa::SamplerParams& sp) {
  using namespace dsa;
  const ModelConfig& c = model.config;
  std::vector<std::vector<int32_t>> prompts = encode_prompt_file(a, c, tok);
  int longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, int(p.size()));
  const int K = a.parallel > 0 ? std::min(a.parallel, int(prompts.size())) : int(prompts.size());
  EngineOptions eo;
  eo.cache = cli::parse_cache_type(a.kv_cache);
  eo.max_ctx = a.ctx > 0 ? a.ctx : longest + std::max(a.n, 1);
  if (c.max_position_embeddings > 0) eo.max_ctx = std::min(eo.max_ctx, c.max_position_embeddings);
  eo.max_seqs = K;
  eo.max_step_tokens = std::min(a.batch, eo.max_ctx) + K;
  a.cache.apply(eo);
  Engine engine(model, eo);
  std::fprintf(stderr, "%s | %zu prompts, up to %d at a time\n", engine.capacity().describe().c_str(), prompts.size(), K);
  ParallelOptions po;
  po.parallel = K;
  po.prefill_chunk = a.batch;
  const auto t0 = std::chrono::steady_clock::now();
  int64_t generated = 0;
  generate_parallel(engine, tok, prompts, generate_options(a, sp), po, [&](size_t, GenerateResult& r) {
    generated += int64_t(r.tokens.size());
    if (a.print_ids) {
      for (size_t i = 0; i < r.tokens.size(); ++i) std::printf(i ? ",%d" : "%d", r.tokens[i]);
      std::printf("\n");
    } else {
      std::printf("%s\n", nlohmann::json(r.text).dump().c_str());
    }
    std::fflush(stdout);
  });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const PrefixStats& ps = engine.prefix_stats();
  std::fprintf(stderr, "%zu prompts: %lld tokens generated in %.2f s (%.1f tok/s) | prefix cache: %lld/%lld blocks hit\n", prompts.size(),
               static_cast<long long>(generated), s, double(generated) / s, static_cast<long long>(ps.hits),
               static_cast<long long>(ps.queries));
}

void run(Args& a) {
  using namespace dsa;
  const bool many = !a.prompts.empty();
  if (int(a.prompt.empty()) + int(a.ids.empty()) + int(!many) != 2)
    throw Error("give exactly one of -p/--prompt (text), --ids (token ids) or --prompts FILE");
  if (!a.ids.empty() && !a.print_ids) throw Error("--ids needs --print-ids (generated ids are printed, not text)");
  // With --print-ids stdout carries only the ids; text is not printed.
  if (!a.ids.empty() && (a.chat || a.thinking || !a.stop.empty()))
    throw Error("--chat, --thinking and --stop work on text: use -p instead of --ids");
  if (a.parallel > 0 && !many) throw Error("--parallel needs --prompts");
  if (many && a.mtp && a.parallel != 1) throw Error("--mtp with --prompts runs one sequence at a time: add --parallel 1");
  if (a.n < 0) throw Error("-n: expected >= 0, got " + std::to_string(a.n));
  const SamplerParams sp = a.sampling.resolve();

  const auto t0 = std::chrono::steady_clock::now();
  const RankShard shard = a.par.shard();
  auto model = Model::load(a.model, /*load_mtp=*/a.mtp, /*verbose=*/!a.print_ids && shard.rank == 0, /*prefetch=*/true, shard);
  const ModelConfig& c = model->config;
  std::optional<Tokenizer> tok;
  // --print-ids with --prompts reads id lines (no tokenizer); with -p text, the tokenizer.
  if (a.ids.empty() && !(many && a.print_ids)) tok.emplace(Tokenizer::from_dir(a.model));
  if (many && !a.mtp) {
    run_prompts(a, *model, tok ? &*tok : nullptr, sp);
    return;
  }
  std::vector<std::vector<int32_t>> prompts;
  if (many) {
    prompts = encode_prompt_file(a, c, tok ? &*tok : nullptr);
  } else {
    prompts.push_back(encode_prompt(a, c, tok ? &*tok : nullptr, a.ids.empty() ? a.prompt : a.ids, "--ids"));
  }
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  int longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, int(p.size()));
  EngineOptions eo;
  eo.cache = cli::parse_cache_type(a.kv_cache);
  eo.max_ctx = a.ctx > 0 ? a.ctx : longest + std::max(a.n, 1);
  if (c.max_position_embeddings > 0) eo.max_ctx = std::min(eo.max_ctx, c.max_position_embeddings);
  eo.max_seqs = 1;
  eo.max_step_tokens = std::max(2, std::min(a.batch, eo.max_ctx));  // a speculative step verifies two
  eo.mtp = a.mtp;
  a.cache.apply(eo);
  Engine engine(*model, eo);
  if (!a.print_ids) std::fprintf(stderr, "%s\n", engine.capacity().describe().c_str());
  GeneratorOptions go;
  go.prefill_chunk = a.batch;
  go.mtp = a.mtp;
  Generator gen(engine, tok ? &*tok : nullptr, go);
  for (const auto& prompt : prompts) {
    bool first = true;
    const GenerateResult r = gen.generate(
        prompt, generate_options(a, sp),
        [&](std::string_view s) {
          if (a.print_ids || many) return;
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
    if (many && !a.print_ids) std::printf("%s", nlohmann::json(r.text).dump().c_str());
    std::printf("\n");
    std::fflush(stdout);
    std::fprintf(stderr, "load: %.2f s | prompt: %d tokens (%d cached), %.1f tok/s | generated: %zu tokens, %.1f tok/s%s | stop: %s\n",
                 load_s, r.prompt_tokens, r.reused_tokens, r.prefill_tok_s(), r.tokens.size(), r.decode_tok_s(),
                 cli::mtp_summary(r).c_str(), to_string(r.reason));
  }
}

void setup_run(CLI::App& app) {
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("run", "Generate completions: text in, streamed text out (or ids in, ids out)");
  cmd->add_option("--model", a->model, "Model directory (config.json, safetensors, tokenizer.json)")->required();
  a->par.add(cmd);
  cmd->add_option("-p,--prompt", a->prompt, "Prompt text");
  cmd->add_option("--ids", a->ids, "Prompt as comma-separated token ids (no tokenizer needed; with --print-ids)");
  cmd->add_option("--prompts", a->prompts,
                  "File of prompts, one per line: a JSON string, or comma-separated ids with --print-ids; one result line each, in order");
  cmd->add_option("--parallel", a->parallel, "With --prompts: sequences stepping together (default: all)")
      ->check(dsa::cli::int_in(1, 4096));
  cmd->add_flag("--print-ids", a->print_ids, "Print the generated ids as one comma-separated line instead of text");
  cmd->add_option("-n,--n-predict", a->n, "Maximum tokens to generate")->capture_default_str()->check(dsa::cli::int_in(0, dsa::cli::kMaxTokens));
  cmd->add_option("--stop", a->stop, "Stop when this text is produced (repeatable; not printed)");
  cmd->add_flag("--chat", a->chat, "Wrap the prompt as one user message in the model's chat encoding");
  cmd->add_flag("--thinking", a->thinking, "Chat encoding in thinking mode (implies --chat)");
  cmd->add_flag("--ignore-eos", a->ignore_eos, "Keep generating past end-of-sequence tokens");
  cmd->add_flag("--mtp", a->mtp, dsa::cli::kMtpHelp);
  cmd->add_option("--ctx", a->ctx, "Context per sequence in tokens (default: the longest prompt + n)")->check(dsa::cli::int_in(1, dsa::cli::kMaxTokens));
  cmd->add_option("--batch", a->batch, "Prefill chunk: tokens per forward step")->capture_default_str()->check(dsa::cli::int_in(1, dsa::cli::kMaxTokens));
  cmd->add_option("--kv-cache", a->kv_cache, "f32, bf16, fp8 or fp8-656")->capture_default_str();
  a->cache.add(cmd);
  a->sampling.add(cmd);
  cmd->callback([a] { run(*a); });
}

}  // namespace

DSA_COMMAND(10, setup_run);
