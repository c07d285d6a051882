// `dsa logits`: one prefill over ids[0:N], then teacher-forced one-token decode steps;
// writes every row of logits (and optionally MTP logits and the golden-named internals)
// to a safetensors file. External checks call this; keep the contract stable.
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>

#include "cli_util.h"
#include "command.h"
#include "io/safetensors.h"
#include "model/forward.h"

namespace {

struct Args {
  std::string model, ids, out, kv_cache = "fp8";
  int prompt_len = -1;
  bool mtp = false, dump = false;
};

// Collects tapped rows by name and position, then lays them out as [rows, width].
struct Collector {
  std::map<std::string, std::map<int, std::vector<float>>> f;
  std::map<std::string, std::map<int, std::vector<int32_t>>> i;
  dsa::Tap tap() {
    dsa::Tap t;
    t.floats = [this](const std::string& n, int pos, const float* v, int k) { f[n][pos].assign(v, v + k); };
    t.ints = [this](const std::string& n, int pos, const int32_t* v, int k) { i[n][pos].assign(v, v + k); };
    return t;
  }
};

void run(const Args& a) {
  using namespace dsa;
  const std::vector<int32_t> ids = cli::parse_ids(a.ids, "--ids");
  const int T = int(ids.size());
  if (a.prompt_len < 1 || a.prompt_len > T)
    throw Error("--prompt-len: expected 1.." + std::to_string(T) + " (the number of ids), got " + std::to_string(a.prompt_len));
  const CacheType cache = cli::parse_cache_type(a.kv_cache);
  if (a.out.empty()) throw Error("--out: an output file is required");

  auto model = Model::load(a.model, a.mtp);
  const ModelConfig& c = model->config;
  if (a.mtp && !model->weights.mtp) throw Error("--mtp: the model has no MTP layer (num_nextn_predict_layers = 0)");
  for (int32_t id : ids)
    if (id >= c.vocab_size) throw Error("--ids: token id " + std::to_string(id) + " out of range [0, " + std::to_string(c.vocab_size) + ")");

  const int N = a.prompt_len, V = c.vocab_size, H = c.hidden_size;
  StateOptions so;
  so.max_ctx = T;
  so.max_tokens = N;
  so.max_logit_rows = N;
  so.cache = cache;
  so.mtp = a.mtp;
  State st(c, so);
  Collector col;
  const Tap tap = col.tap();
  ForwardOptions fo;
  fo.all_logits = true;
  fo.tap = a.dump ? &tap : nullptr;

  std::vector<float> logits(size_t(T) * size_t(V)), mtp_logits(a.mtp ? size_t(T - 1) * size_t(V) : 0);
  std::vector<float> h_prev(size_t(N) * size_t(H));
  auto run_mtp = [&](const float* h, const int32_t* next, int n, int row0) {
    if (!a.mtp || n <= 0) return;
    const float* ml = forward_mtp(*model, st, h, next, n, fo);
    std::copy_n(ml, size_t(n) * size_t(V), &mtp_logits[size_t(row0) * size_t(V)]);
  };

  std::fprintf(stderr, "prefill: %d tokens\n", N);
  const float* l = forward(*model, st, ids.data(), N, fo);
  std::copy_n(l, size_t(N) * size_t(V), logits.data());
  std::copy_n(st.h_final.data(), size_t(N) * size_t(H), h_prev.data());
  // MTP row i predicts token i+2 from h[i] and ids[i+1]: rows 0..N-2 now, then one per step.
  run_mtp(h_prev.data(), &ids[1], std::min(N - 1, T - 1), 0);
  for (int t = N; t < T; ++t) {
    l = forward(*model, st, &ids[size_t(t)], 1, fo);
    std::copy_n(l, size_t(V), &logits[size_t(t) * size_t(V)]);
    // MTP position t-1 needs h[t-1] (the previous step's) and ids[t].
    const std::vector<float> h_last(h_prev.end() - H, h_prev.end());
    run_mtp(h_last.data(), &ids[size_t(t)], 1, t - 1);
    std::copy_n(st.h_final.data(), size_t(H), h_prev.end() - H);
  }

  std::vector<TensorBlob> out;
  out.push_back(make_blob_f32("logits", {T, V}, logits.data()));
  if (a.mtp) out.push_back(make_blob_f32("mtp.logits", {T - 1, V}, mtp_logits.data()));
  for (auto& [name, rows] : col.f) {
    const int nrows = int(rows.size());
    size_t width = 0;
    for (auto& [p, r] : rows) width = std::max(width, r.size());
    // Score rows cover keys 0..pos; the rest of a causal row is -inf, as in the goldens.
    if (name.rfind("indexer.scores.", 0) == 0) width = size_t(nrows);
    std::vector<float> buf(size_t(nrows) * width, -std::numeric_limits<float>::infinity());
    for (auto& [p, r] : rows) std::copy(r.begin(), r.end(), &buf[size_t(p) * width]);
    out.push_back(make_blob_f32(name, {nrows, int64_t(width)}, buf.data()));
  }
  for (auto& [name, rows] : col.i) {
    const size_t width = rows.begin()->second.size();
    std::vector<int32_t> buf(rows.size() * width, -1);
    for (auto& [p, r] : rows) std::copy(r.begin(), r.end(), &buf[size_t(p) * width]);
    out.push_back(make_blob_i32(name, {int64_t(rows.size()), int64_t(width)}, buf.data()));
  }
  write_safetensors(a.out, out, {{"format", "dsa.logits"}});
  std::fprintf(stderr, "wrote %s: logits [%d, %d]%s\n", a.out.c_str(), T, V, a.mtp ? " and mtp.logits" : "");
}

void setup_logits(CLI::App& app) {
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("logits", "Teacher-forced logits: one prefill over the prompt, then one-token decode steps");
  cmd->add_option("--model", a->model, "Model directory (config.json + safetensors)")->required();
  cmd->add_option("--ids", a->ids, "Comma-separated token ids, the whole sequence")->required();
  cmd->add_option("--prompt-len", a->prompt_len, "Tokens in the prefill pass; the rest are decode steps")->required();
  cmd->add_option("--kv-cache", a->kv_cache, "MLA latent cache: f32, bf16, fp8 (e4m3 latent, exact rope key) or fp8-656 (deployment layout, bf16 rope key)")->capture_default_str();
  cmd->add_flag("--mtp", a->mtp, "Also compute the MTP layer's logits (mtp.logits [T-1, vocab])");
  cmd->add_flag("--dump-internals", a->dump, "Also write hidden.{i}, indexer.scores.{i}, indexer.topk.{i}, moe.experts.{i}");
  cmd->add_option("--out", a->out, "Output .safetensors file (written only on success)")->required();
  cmd->callback([a] { run(*a); });
}

}  // namespace

DSA_COMMAND(30, setup_logits);
