#pragma once
// The operator plan: the list of operators one forward step runs, with FLOPs and bytes
// derived from shapes. This is the table shared by `dsa plan` (which costs it against a
// hardware profile) and by the engine's `dsa bench` (which reports achieved bandwidth and
// FLOP rates against it), so the two cannot drift apart.
//
// Operator names follow the engine's forward pass:
//   embed, layer.norms, attn.{q_a_proj, kv_a_proj, q_b_proj, rope, kv_b_proj, q_absorb,
//   core, v_up, o_proj, cache_write}, indexer.{wq_b, wk, weights_proj, quant, score, topk},
//   mlp.{gate_up, act, down}, moe.{router, experts_gate_up, act, experts_down,
//   shared_gate_up, shared_down, dispatch, combine}, tp.allreduce, pp.send, final_norm, lm_head,
//   and mtp.<any of these> for the multi-token-prediction draft layer.
#include <cstdint>
#include <string>
#include <vector>

#include "sim/model.h"

namespace dsa::sim {

enum class Phase { Prefill, Decode };
enum class WeightDtype { FP8, BF16, NVFP4 };
enum class CacheDtype { FP8, BF16 };
// What limits an operator and which efficiency factor applies to it.
enum class OpClass { Gemm, AttentionDense, AttentionSparse, Indexer, Topk, Memory, CommTP, CommEP, CommPP };

const char* phase_name(Phase p);
const char* op_class_name(OpClass c);
WeightDtype parse_weight_dtype(const std::string& s);  // fp8 | bf16 | nvfp4
CacheDtype parse_cache_dtype(const std::string& s);    // fp8 | bf16

// Parallel layout. Attention runs tp-way tensor parallel inside each of dp data-parallel
// groups (or rep replicas); MoE experts are split ep-way (moe_tp() = tp*dp*rep/ep ways inside
// each expert); pp pipeline stages split the layers. devices() = tp*dp*rep*pp.
struct Layout {
  int tp = 1, dp = 1, ep = 1, pp = 1;
  // Attention replicas (with dp 1): rep tp groups of a stage run the same tokens' attention,
  // dense layers and shared expert, as this engine's --ep without --dp does: every rank has
  // every token, so the routed experts' partial outputs are summed by one all-reduce per MoE
  // layer instead of being dispatched and combined, and the head is split by vocabulary rows
  // over the stage with its logits all-gathered.
  int rep = 1;
  // Extra replicas of popular experts (DeepSeek's EPLB: 32 in its EP32 prefill and EP144
  // decode deployments), so that E + redundant_experts slots spread evenly over ep ranks.
  int redundant_experts = 0;
  int devices_per_node = 8;  // from the hardware profile: decides NVLink vs network hops
  int devices() const { return tp * dp * rep * pp; }
  int moe_tp() const { return tp * dp * rep / ep; }
  void validate() const;  // throws dsa::Error
};

struct Options {
  WeightDtype weight = WeightDtype::FP8;
  CacheDtype cache = CacheDtype::FP8;
  int mtp = 0;  // draft tokens per decode step (needs an MTP layer)
  // Prefill attention in the absorbed form at every prompt length (the profile's
  // prefill_absorbed: the CPU engine); else the expanded form while it is cheaper.
  bool absorbed_prefill = false;
  // This engine's collectives (the profile's engine_collectives: the CPU engine's MPI
  // runtime); else the GPU frameworks'.
  bool engine_collectives = false;
};

// One forward step of one attention data-parallel group (one pipeline micro-batch).
struct Step {
  Phase phase = Phase::Decode;
  int64_t seqs = 1;        // sequences in the step
  int64_t new_tokens = 1;  // per sequence: prompt chunk (prefill) or 1 + mtp (decode)
  int64_t context = 0;     // tokens already cached per sequence before the step
};

struct Op {
  std::string name;
  Phase phase = Phase::Decode;
  OpClass cls = OpClass::Gemm;
  int bits = 16;         // compute precision: 4, 8, 16 (32 is costed at the 16-bit rate)
  double count = 0;      // invocations in the step (layers it runs in)
  double flops = 0;      // total over `count`, on one device
  double bytes = 0;      // memory traffic, total over `count`, on one device
  double weight_elems = 0;  // weight elements streamed (CPU widening, packing and GEMV costs)
  bool per_head = false;    // a GEMM run as one small product per attention head (the efficiency's gemm_heads)
  double comm_intra = 0;    // bytes sent over the scale-up domain, total
  double comm_inter = 0;    // bytes sent over the network, total
  double comm_hops = 0;     // latency-bound message rounds, total
  std::string shape;        // one invocation's shape: the key into a measured kernel table
};

// Bytes of one weight element: fp8 1 + one fp32 scale per 128x128 block; bf16 2; nvfp4 0.5 +
// one fp8 scale per 16 elements.
double weight_bytes_per_elem(WeightDtype w);
// KV-cache bytes per token for one layer: MLA latent (656 fp8 / 1152 bf16) and the indexer
// key of a full layer (132: fp8 128 + fp32 scale, whatever the latent's format).
double mla_cache_bytes(const SimModel& m, CacheDtype c);
double indexer_cache_bytes(const SimModel& m);
// Cached bytes per token for the whole model (main layers, plus the MTP layer when mtp > 0).
double cache_bytes_per_token(const SimModel& m, const Options& o);

// Sum over the new tokens j = 1..n of min(context + j, cap): the keys each query attends to.
double sum_keys(int64_t context, int64_t n, int64_t cap);

// The operator plan of one step on one device. Ops with the same name are merged across
// layers (count = number of layers). Order: the forward order of the first occurrence.
std::vector<Op> op_plan(const SimModel& m, const Step& s, const Layout& l, const Options& o);

// --- Helpers for the engine's `dsa bench` (one CPU, one sequence, fp8 weights and caches) ---
// Bytes moved per generated token when decoding at `context` cached tokens.
double decode_bytes_per_token(const SimModel& m, int64_t context);
// FLOPs per prompt token when prefilling `input_len` tokens from an empty cache.
double prefill_flops_per_token(const SimModel& m, int64_t input_len);
double plan_total_flops(const std::vector<Op>& ops);
double plan_total_bytes(const std::vector<Op>& ops);

}  // namespace dsa::sim
