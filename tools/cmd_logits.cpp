// `dsa logits`: one prefill over ids[0:N], then teacher-forced one-token decode steps;
// writes every row of logits (and optionally MTP logits and the golden-named internals)
// to a safetensors file. External checks call this; keep the contract stable.
#include <cstdio>
#include <filesystem>

#include "cli_util.h"
#include "command.h"
#include "io/safetensors.h"
#include "runtime/teacher_forcing.h"

namespace {

struct Args {
  std::string model, ids, out, kv_cache = "fp8";
  int prompt_len = -1, batch_with = 0;
  uint64_t batch_seed = 1;
  bool mtp = false, dump = false;
  dsa::cli::ParallelFlags par;
};

void run(const Args& a) {
  using namespace dsa;
  const std::vector<int32_t> ids = cli::parse_ids(a.ids, "--ids");
  const int T = int(ids.size());
  if (a.prompt_len < 1 || a.prompt_len > T)
    throw Error("--prompt-len: expected 1.." + std::to_string(T) + " (the number of ids), got " + std::to_string(a.prompt_len));
  const CacheType cache = cli::parse_cache_type(a.kv_cache);
  // The output path is checked before the work, not after it.
  {
    namespace fs = std::filesystem;
    const fs::path out(a.out);
    const fs::path parent = out.parent_path().empty() ? fs::path(".") : out.parent_path();
    if (a.out.empty() || out.filename().empty() || fs::is_directory(out))
      throw Error("--out: expected a file path for the .safetensors output, got '" + a.out + "'");
    if (!fs::is_directory(parent)) throw Error("--out: directory '" + parent.string() + "' does not exist");
  }

  const RankShard shard = a.par.shard();
  auto model = Model::load(a.model, a.mtp, false, true, shard);
  const ModelConfig& c = model->config;
  if (a.mtp && !model->weights.mtp) throw Error("--mtp: the model has no MTP layer (num_nextn_predict_layers = 0)");
  if (T > c.max_position_embeddings)
    throw Error("--ids: " + std::to_string(T) + " tokens exceed the model's max_position_embeddings (" + std::to_string(c.max_position_embeddings) + ")");
  for (int32_t id : ids)
    if (id >= c.vocab_size) throw Error("--ids: token id " + std::to_string(id) + " out of range [0, " + std::to_string(c.vocab_size) + ")");

  if (a.dump && a.batch_with > 0) throw Error("--dump-internals records one sequence alone: it does not combine with --batch-with");
  std::fprintf(stderr, "prefill %d tokens, then %d decode steps", a.prompt_len, T - a.prompt_len);
  if (a.batch_with > 0) std::fprintf(stderr, ", stepping with %d other sequences (seed %llu)", a.batch_with, static_cast<unsigned long long>(a.batch_seed));
  std::fprintf(stderr, "\n");
  TeacherForcingOptions o;
  o.cache = cache;
  o.mtp = a.mtp;
  o.internals = a.dump;
  o.batch_with = a.batch_with;
  o.batch_seed = a.batch_seed;
  const TeacherForcedResult r = run_teacher_forced(*model, ids, a.prompt_len, o);

  std::vector<TensorBlob> out;
  out.push_back(make_blob_f32("logits", {T, r.vocab}, r.logits.data()));
  if (a.mtp) out.push_back(make_blob_f32("mtp.logits", {T - 1, r.vocab}, r.mtp_logits.data()));
  for (const auto& [name, f] : r.floats) out.push_back(make_blob_f32(name, f.shape, f.v.data()));
  for (const auto& [name, i] : r.ints) out.push_back(make_blob_i32(name, i.shape, i.v.data()));
  if (shard.rank != 0) return;  // rank 0 writes the file
  write_safetensors(a.out, out, {{"format", "dsa.logits"}});
  std::fprintf(stderr, "wrote %s: logits [%d, %d]%s\n", a.out.c_str(), T, r.vocab, a.mtp ? " and mtp.logits" : "");
}

void setup_logits(CLI::App& app) {
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("logits", "Teacher-forced logits: one prefill over the prompt, then one-token decode steps");
  cmd->add_option("--model", a->model, "Model directory (config.json + safetensors)")->required();
  cmd->add_option("--ids", a->ids, "Comma-separated token ids, the whole sequence")->required();
  cmd->add_option("--prompt-len", a->prompt_len, "Tokens in the prefill pass; the rest are decode steps")->required();
  cmd->add_option("--kv-cache", a->kv_cache,
                  "MLA latent cache: f32, bf16, fp8 (e4m3 latent, exact rope key) or fp8-656 (deployment layout, bf16 rope key)")
      ->capture_default_str();
  cmd->add_flag("--mtp", a->mtp, "Also compute the MTP layer's logits (mtp.logits [T-1, vocab])");
  cmd->add_flag("--dump-internals", a->dump, "Also write hidden.{i}, indexer.scores.{i}, indexer.topk.{i}, moe.experts.{i}");
  cmd->add_option("--batch-with", a->batch_with,
                  "Step together with N other sequences (random ids and lengths, prefilling and decoding); the file is the same as alone")
      ->capture_default_str()
      ->check(dsa::cli::int_in(0, 1024));
  cmd->add_option("--batch-seed", a->batch_seed, "Seed of the --batch-with sequences")->capture_default_str();
  cmd->add_option("--out", a->out, "Output .safetensors file (written only on success)")->required();
  a->par.add(cmd);
  cmd->callback([a] { run(*a); });
}

}  // namespace

DSA_COMMAND(30, setup_logits);
