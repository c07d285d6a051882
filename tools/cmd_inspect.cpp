// `dsa inspect`: what a checkpoint is, without running it.
#include <cstdio>
#include <map>

#include "cli_util.h"
#include "command.h"
#include "kernels/kernels.h"
#include "model/weights.h"

namespace {

std::string human(double b) {
  const char* u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024 && i < 4) { b /= 1024; ++i; }
  char s[32];
  std::snprintf(s, sizeof s, i ? "%.2f %s" : "%.0f %s", b, u[i]);
  return s;
}

struct Layout {
  int ep = 1, pp = 1, tp = 1;
  bool dp = false;
};

// The layout's rank 0, checked against the model.
dsa::RankShard layout_shard(const dsa::Model& m, const Layout& l) {
  dsa::RankShard s;
  s.ep = l.ep;
  s.pp = l.pp;
  s.tp = l.tp;
  s.dp = l.dp;
  s.ranks = l.pp * std::max(l.ep, l.tp);
  s.mtp_uses_main_embedding = m.shard.mtp_uses_main_embedding;
  s.validate(m.config);
  return s;
}

// The bytes each rank of the layout reads, with what it holds.
void print_layout(const dsa::Model& m, const Layout& l) {
  using namespace dsa;
  const ModelConfig& c = m.config;
  RankShard s = layout_shard(m, l);
  std::printf("layout:       %s = %d ranks%s%s, bytes read per rank:\n", s.describe().c_str(), s.ranks,
              l.ep > 1 ? (", " + std::to_string(c.n_routed_experts / l.ep) + " routed experts each").c_str() : "",
              l.tp > 1 ? (", " + std::to_string(c.num_attention_heads / l.tp) + " attention heads each, " +
                          (l.ep > 1 ? "dense and shared MLPs" : "MLPs") + " split " + std::to_string(l.tp) + " ways")
                             .c_str()
                       : "");
  const int L = c.num_hidden_layers;
  for (int r = 0; r < s.ranks; ++r) {
    s.rank = r;
    std::printf("  rank %-4d   %-10s layers %d-%d%s\n", r, human(double(shard_bytes(m.files, c, s))).c_str(), s.first_layer(L),
                s.end_layer(L) - 1, s.last_stage() && c.num_nextn_predict_layers ? " + MTP" : "");
  }
}

void run(const std::string& dir, const Layout& layout) {
  using namespace dsa;
  // Shapes and names only: the weights stay mapped on demand (a real checkpoint is hundreds
  // of GB; inspecting it must not read them).
  auto m = Model::load(dir, true, /*verbose=*/false, /*prefetch=*/false);
  const ModelConfig& c = m->config;
  layout_shard(*m, layout);  // a layout that does not fit fails before anything is printed
  std::map<std::string, uint64_t> by_dtype;
  uint64_t total = 0;
  for (const auto& [name, t] : m->files.tensors()) {
    by_dtype[dtype_name(t.dtype)] += t.nbytes;
    total += t.nbytes;
  }
  const int full = c.num_full_indexer_layers();
  const int fp8 = c.num_hidden_layers * ModelConfig::mla_cache_bytes_fp8(c.kv_lora_rank, c.qk_rope_head_dim) +
                  full * ModelConfig::indexer_cache_bytes(c.index_head_dim);
  const int bf16 = c.num_hidden_layers * 2 * (c.kv_lora_rank + c.qk_rope_head_dim) + full * ModelConfig::indexer_cache_bytes(c.index_head_dim);
  std::printf("model:        %s\n", dir.c_str());
  std::printf("kernels:      %s tier%s (cpu: %s)\n", kernels::isa_name(kernels::isa()), kernels::bf16_dot() ? ", bf16 dot products" : "",
              kernels::cpu_features().c_str());
  std::printf("family:       %s (%s)\n", c.family == Family::DeepseekV32 ? "DeepSeek-V3.2" : "GLM-5", c.model_type.c_str());
  std::printf("layers:       %d (%d dense + %d MoE)%s\n", c.num_hidden_layers, std::min(c.first_k_dense_replace, c.num_hidden_layers),
              c.num_hidden_layers - std::min(c.first_k_dense_replace, c.num_hidden_layers),
              c.num_nextn_predict_layers ? ", + 1 MTP layer" : "");
  std::printf("dims:         hidden %d, heads %d, q_lora %d, kv_lora %d, qk %d+%d, v %d, vocab %d\n", c.hidden_size,
              c.num_attention_heads, c.q_lora_rank, c.kv_lora_rank, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim, c.vocab_size);
  std::printf("moe:          %d routed (%d per token, %d groups, top %d), %d shared, inter %d\n", c.n_routed_experts,
              c.num_experts_per_tok, c.n_group, c.topk_group, c.n_shared_experts, c.moe_intermediate_size);
  std::printf("parameters:   %.3f B (%s in %zu file(s))\n", double(m->parameter_count()) / 1e9, human(double(total)).c_str(), m->files.num_files());
  for (const auto& [dt, b] : by_dtype) std::printf("  %-8s    %s\n", dt.c_str(), human(double(b)).c_str());
  std::printf("rope:         %s, theta %g%s\n", c.rope.yarn ? "YaRN" : "plain", c.rope.theta,
              c.rope.yarn ? (", factor " + std::to_string(c.rope.factor)).c_str() : "");
  std::printf("indexer:      %d heads x %d, top-k %d, rope %s\n", c.index_n_heads, c.index_head_dim, c.index_topk,
              c.indexer_rope_interleave ? "interleaved" : "half-split (NeoX)");
  std::printf("schedule:     %s (%d full, %d shared; F = own indexer, S = reuses the previous full layer)\n",
              c.indexer_schedule_str().c_str(), full, c.num_hidden_layers - full);
  std::printf("cache/token:  %d B with fp8 latent (656-byte layout), %d B with bf16 latent (main layers)\n", fp8, bf16);
  if (layout.ep * layout.pp * layout.tp > 1) print_layout(*m, layout);
}

void setup_inspect(CLI::App& app) {
  auto dir = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand("inspect", "Summarize a checkpoint: family, layers, parameters, bytes by dtype, cache per token");
  auto l = std::make_shared<Layout>();
  cmd->add_option("--model", *dir, "Model directory (config.json + safetensors)")->required();
  cmd->add_option("--ep", l->ep, "With --pp/--tp: a layout's expert-parallel ranks per stage; prints each rank's bytes")
      ->check(dsa::cli::int_in(1, 4096));
  cmd->add_option("--pp", l->pp, "The layout's pipeline stages")->check(dsa::cli::int_in(1, 4096));
  cmd->add_option("--tp", l->tp, "The layout's tensor-parallel ranks per stage")->check(dsa::cli::int_in(1, 4096));
  cmd->add_flag("--dp", l->dp, "The layout attends data-parallel (with --ep): each rank holds the whole head");
  cmd->callback([dir, l] { run(*dir, *l); });
}

}  // namespace

DSA_COMMAND(40, setup_inspect);
