#pragma once
// Weights: typed views into the mmapped checkpoint, bound by their Hugging Face names
// with a dtype and full-shape check. Nothing is converted or copied.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "kernels/kernels.h"
#include "model/config.h"

namespace dsa {

struct MlaWeights {
  Linear q_a_proj;            // [q_lora_rank, hidden]
  Vec q_a_layernorm;          // [q_lora_rank]
  Linear q_b_proj;            // [heads * (nope + rope), q_lora_rank], per head [nope | rope]
  Linear kv_a_proj_with_mqa;  // [kv_lora_rank + rope, hidden] = [latent | k_rope]
  Vec kv_a_layernorm;         // [kv_lora_rank]
  Linear kv_b_proj;           // [heads * (nope + v), kv_lora_rank], per head [k_nope | v]
  Linear o_proj;              // [hidden, heads * v]
};

struct IndexerWeights {       // only for layers that run their own indexer
  Linear wq_b;                // [index_heads * 128, q_lora_rank], per head [rope | nope]
  Linear wk;                  // [128, hidden]
  Vec k_norm_weight, k_norm_bias;  // LayerNorm [128]
  Linear weights_proj;        // [index_heads, hidden]
};

struct MlpWeights {           // SwiGLU: down(silu(gate(x)) * up(x))
  Linear gate_proj, up_proj;  // [inter, hidden]
  Linear down_proj;           // [hidden, inter]
};

struct MoeWeights {
  Linear gate;                    // router [n_routed_experts, hidden]
  Vec e_score_correction_bias;    // [n_routed_experts], selection only
  std::vector<MlpWeights> experts;
  bool has_shared = false;
  MlpWeights shared_experts;      // inter = moe_intermediate_size * n_shared_experts
};

struct LayerWeights {
  Vec input_layernorm, post_attention_layernorm;  // [hidden]
  MlaWeights self_attn;
  bool has_indexer = false;
  IndexerWeights indexer;
  bool is_moe = false;
  MlpWeights mlp;   // dense layers
  MoeWeights moe;   // MoE layers
};

struct MtpWeights {  // layer index num_hidden_layers
  Vec enorm, hnorm;             // [hidden]
  Linear eh_proj;               // [hidden, 2 * hidden] over [enorm(emb) ; hnorm(h)]
  Vec shared_head_norm;         // [hidden]
  Linear shared_head_head;      // [vocab, hidden]; the main lm_head when absent (GLM)
  Linear embed_tokens;          // [vocab, hidden]; the main embedding when absent
  LayerWeights block;
};

struct ModelWeights {
  Linear embed_tokens;          // [vocab, hidden]
  Vec norm;                     // [hidden]
  Linear lm_head;               // [vocab, hidden]
  std::vector<LayerWeights> layers;
  std::optional<MtpWeights> mtp;

  // Binds every tensor of `cfg` from `st`; throws dsa::Error naming the tensor with
  // expected vs actual dtype/shape. The MTP layer is bound only when `load_mtp`.
  static ModelWeights bind(const ModelConfig& cfg, const SafeTensors& st, bool load_mtp);
};

// How data-parallel attention's MoE layers move each token to its experts' ranks (moe.cpp):
// chosen by the step's size, or one of the two always.
enum class MoeDispatch { Auto, AllGather, AllToAll };
// Auto's choice for a step of `total_tokens` over `ranks` members, each token picking
// `experts_per_tok` experts: all-to-all when it moves enough fewer bytes (moe.cpp says why).
// `dsa plan` costs the same choice.
bool moe_alltoall_pays(int ranks, int experts_per_tok, int64_t total_tokens);

// This process's part of a parallel layout (a constant of the loaded model). The job's
// `ranks` form pp pipeline stages of group() ranks each (world rank = stage * group() +
// member); stage s holds main layers [s * L / pp, (s + 1) * L / pp), the first stage the
// embedding, the last the final norm, the head and the MTP layer. Within a stage:
// - ep > 1 (= group()): routed expert e belongs to member e * ep / n_routed_experts:
//   contiguous ranges, so that when ep divides n_group each member holds whole expert groups
//   and a DeepSeek token, which picks at most topk_group groups, touches at most that many.
//   The shared expert runs on member 0; the members' partial MoE outputs are summed.
// - tp > 1 (= group()): each member holds num_attention_heads / tp heads (their rows of
//   q_b_proj and kv_b_proj) and hidden / tp rows of o_proj (see mla.cpp). The indexer, q_a,
//   kv_a and the latent cache are on every member. Every MLP is split the same way: each
//   member holds 1/tp of the rows of gate_proj and up_proj (the intermediate) and of
//   down_proj (the output): the dense layers', the shared expert's, and each routed
//   expert's unless ep splits the experts themselves (see mlp.cpp).
// - dp (with ep = group(), tp = 1): data-parallel attention, as vLLM and SGLang run
//   these models with expert parallelism: each member attends (and runs the dense layers,
//   the shared expert and the head) for its own sequences only; each MoE layer brings
//   every member's tokens to the members of their experts (all-gather or all-to-all,
//   moe_dispatch) and sums each token's partial outputs back onto the member that owns it.
// - group() > 1 and not dp: the head is split by vocabulary rows when group() divides the
//   vocabulary: it is the largest tensor every member would otherwise read each step. Under
//   tp > 1 the embeddings are split the same way (forward.cpp).
// Everything else of a stage's layers (dense layers, norms, the router) is on every member.
struct RankShard {
  int rank = 0, ranks = 1;
  int ep = 1, tp = 1, pp = 1;
  bool dp = false;  // data-parallel attention over the stage's members (see above)
  // The MTP layer has no embedding of its own and uses the main one (GLM): the last stage
  // holds it too. Set by Model::load.
  bool mtp_uses_main_embedding = false;
  // Collectives, set by the runtime when ranks > 1 (the model library links no MPI). Over
  // this rank's stage: the sum of the members' data in place (on every member), and each
  // member's [rows, cols / group()] block into its columns of out [rows, cols].
  void (*sum)(float* data, size_t n) = nullptr;
  void (*sum_f64)(double* data, size_t n) = nullptr;  // the MoE's unrounded partial outputs (moe.cpp)
  void (*gather_columns)(const float* part, int rows, int cols, float* out) = nullptr;
  // Over the job (world ranks): point to point between stages, and a broadcast from `root`.
  void (*send)(const void* data, size_t bytes, int to) = nullptr;
  void (*recv)(void* data, size_t bytes, int from) = nullptr;
  void (*broadcast)(float* data, size_t n, int root) = nullptr;
  // Over the stage, for data-parallel attention: every member's `mine` into all[group()]; the
  // members' [counts[r], cols] row blocks into all (member order); and the sum over the
  // members of all [sum of counts, cols], each member keeping its own block in mine.
  void (*gather_counts)(int mine, int* all) = nullptr;
  void (*gather_rows)(const float* mine, const int* counts, int cols, float* all) = nullptr;
  void (*sum_scatter_rows)(const double* all, const int* counts, int cols, double* mine) = nullptr;
  // All-to-all over the stage: one int to and from each member, and row blocks of `cols`
  // floats or doubles (send_rows[r] rows to member r, recv_rows[r] from it, blocks in member order).
  void (*exchange_counts)(const int* send, int* recv) = nullptr;
  void (*exchange_rows)(const float* send, const int* send_rows, const int* recv_rows, int cols, float* recv) = nullptr;
  void (*exchange_rows_f64)(const double* send, const int* send_rows, const int* recv_rows, int cols, double* recv) = nullptr;
  MoeDispatch moe_dispatch = MoeDispatch::Auto;
  // Pipeline micro-batches a step may be split into (forward.cpp); 0: chosen per step.
  int micro_batches = 0;

  int group() const { return ranks / pp; }
  int stage() const { return rank / group(); }
  int member() const { return rank % group(); }
  bool first_stage() const { return stage() == 0; }
  bool last_stage() const { return stage() == pp - 1; }
  int first_layer(int n_layers) const { return int(int64_t(stage()) * n_layers / pp); }
  int end_layer(int n_layers) const { return int(int64_t(stage() + 1) * n_layers / pp); }
  // Main layer l (l == n_layers: the MTP layer, on the last stage) is on this rank's stage.
  bool owns_layer(int l, int n_layers) const {
    return l >= n_layers ? last_stage() : l >= first_layer(n_layers) && l < end_layer(n_layers);
  }
  int expert_owner(int expert, int n_experts) const { return ep <= 1 ? member() : int(int64_t(expert) * ep / n_experts); }
  bool owns(int expert, int n_experts) const { return expert_owner(expert, n_experts) == member(); }
  bool runs_shared_expert() const { return ep <= 1 || tp > 1 || member() == 0; }
  bool splits_mlps() const { return tp > 1; }                  // dense layers and the shared expert
  bool splits_experts() const { return tp > 1 && ep <= 1; }    // each routed expert by rows
  bool splits_head(int vocab) const { return group() > 1 && !dp && vocab % group() == 0; }
  // The embeddings (the main one, the MTP layer's) by vocabulary rows, under tensor
  // parallelism, as the planner's --tp splits them.
  bool splits_embedding(int vocab) const { return tp > 1 && vocab % group() == 0; }
  int dp_ranks() const { return dp ? group() : 1; }  // members attending for sequences of their own
  int head0(int n_heads) const { return tp > 1 ? member() * (n_heads / tp) : 0; }   // first local head
  int n_heads(int n_heads) const { return tp > 1 ? n_heads / tp : n_heads; }        // local heads
  // The bytes of a tensor this rank reads: all of it, none (another stage's layer, another
  // member's expert) or its rows (the head, the tensor-parallel attention weights).
  std::pair<size_t, size_t> owned_bytes(const std::string& tensor, const TensorInfo& t, const ModelConfig& c) const;
  // Throws when the layout does not fit the job (validate_layout) or also the model (checked
  // before any weight is read), naming the flag.
  void validate_layout() const;
  void validate(const ModelConfig& c) const;
  std::string describe() const;  // "ep 2 x pp 1 x tp 1", "+ dp attention" with dp
};

// Bytes of the checkpoint's tensors a rank of `shard` maps and reads.
size_t shard_bytes(const SafeTensors& files, const ModelConfig& c, const RankShard& shard);

// A loaded model: config, the mapped files and the bound weights.
struct Model {
  ModelConfig config;
  SafeTensors files;
  ModelWeights weights;
  RankShard shard;

  // prefetch: map every weight page at load (with progress when verbose) when the files fit
  // in this machine's memory, so that the first tokens do not pay a page fault per 64 KB.
  // With shard.ranks > 1 only this rank's tensors are read (the others stay mapped, unread).
  static std::unique_ptr<Model> load(const std::string& dir, bool load_mtp = true, bool verbose = false, bool prefetch = true,
                                     const RankShard& shard = {});
  uint64_t parameter_count() const;  // tensors bound from the files (weights, not scales)
  // Reads every byte of this rank's tensors `passes` times (one load per cache line, all
  // threads), leaving the weights as a process that has been decoding for a while finds
  // them: on some virtual machines memory left unread for half a minute comes back slowly
  // (2.6 GB read at 3.4, then 21, then 52 GB/s in three passes on a Zen 5 VM, the same
  // bytes every time), so a benchmark of a freshly started process would time the host's
  // memory, not the engine. Returns the bytes read per pass.
  size_t read_weights(int passes) const;
};

}  // namespace dsa
