// FLOP and byte formulas of every operator, checked against arithmetic written out from the
// shapes of the tiny config (tiny.h), plus the cache sizes of the real models.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "core/error.h"
#include "sim/cost.h"
#include "tiny.h"

using namespace dsa::sim;
using dsa::sim::test::tiny;

namespace {

std::map<std::string, Op> by_name(const std::vector<Op>& ops) {
  std::map<std::string, Op> m;
  for (const auto& o : ops) m[o.name] = o;
  return m;
}

const double WB = 1.0 + 4.0 / 16384.0;  // fp8 weight byte incl. its share of a 128x128 block scale
constexpr double kRel = 1e-12;

#define EXPECT_REL(a, b) EXPECT_NEAR((a), (b), std::abs(b) * kRel + 1e-9)

}  // namespace

TEST(SimCost, SumKeys) {
  EXPECT_EQ(sum_keys(0, 5, 1000), 1 + 2 + 3 + 4 + 5);
  EXPECT_EQ(sum_keys(10, 3, 12), 11 + 12 + 12);
  EXPECT_EQ(sum_keys(20, 4, 16), 4 * 16);
  EXPECT_EQ(sum_keys(0, 20, 16), (1 + 16) * 16 / 2 + 4 * 16);
  EXPECT_EQ(sum_keys(5, 0, 16), 0);
}

TEST(SimCost, CacheBytesPerToken) {
  const SimModel t = tiny();
  // latent 128 fp8 + one fp32 scale per 128 + 16 bf16 rope = 164; indexer 128 + 4 = 132.
  EXPECT_EQ(mla_cache_bytes(t, CacheDtype::FP8), 128 + 4 + 32);
  EXPECT_EQ(mla_cache_bytes(t, CacheDtype::BF16), (128 + 16) * 2);
  EXPECT_EQ(cache_bytes_per_token(t, Options{}), 3 * (164 + 132));
  Options mtp;
  mtp.mtp = 1;
  EXPECT_EQ(cache_bytes_per_token(t, mtp), 4 * (164 + 132));
  EXPECT_EQ(cache_bytes_per_token(load_model("deepseek-v3.2"), Options{}), 61 * (656 + 132));  // 48,068
  Options bf;
  bf.cache = CacheDtype::BF16;
  EXPECT_EQ(cache_bytes_per_token(load_model("deepseek-v3.2"), bf), 61 * (1152 + 132));  // 78,324
  EXPECT_EQ(cache_bytes_per_token(load_model("glm-5.2"), Options{}), 78 * 656 + 21 * 132);  // 53,940
  EXPECT_EQ(cache_bytes_per_token(load_model("deepseek-v3"), Options{}), 61 * 656);  // no indexer keys
}

TEST(SimCost, DecodeOpsSingleSequence) {
  const SimModel t = tiny();
  const int64_t c = 100;  // beyond top-k 16: sparse attention reads 16 rows, the indexer all 101
  const auto ops = by_name(op_plan(t, Step{Phase::Decode, 1, 1, c}, Layout{}, Options{}));
  const double L = 3, Lmoe = 2;
  // Projections: 2*M*N*K FLOPs; bytes = fp8 weights + fp8 input + bf16 output.
  EXPECT_REL(ops.at("attn.q_a_proj").flops, L * 2 * 1 * 64 * 256);
  EXPECT_REL(ops.at("attn.q_a_proj").bytes, L * (64 * 256 * WB + 256 * 1 + 64 * 2));
  EXPECT_EQ(ops.at("attn.q_a_proj").count, 3);
  EXPECT_REL(ops.at("attn.kv_a_proj").flops, L * 2 * (128 + 16) * 256);
  EXPECT_REL(ops.at("attn.q_b_proj").flops, L * 2 * (4 * 48) * 64);
  EXPECT_REL(ops.at("attn.q_b_proj").bytes, L * (4 * 48 * 64 * WB + 64 + 4 * 48 * 2));
  EXPECT_REL(ops.at("attn.q_absorb").flops, L * 2 * 4 * 32 * 128);
  EXPECT_REL(ops.at("attn.q_absorb").bytes, L * (4 * 32 * 128 * WB + 4 * 32 * 2 + 4 * 128 * 2));
  // The per-head products are costed at their own factor; the projections are not.
  EXPECT_TRUE(ops.at("attn.q_absorb").per_head);
  EXPECT_FALSE(ops.at("attn.q_b_proj").per_head);
  // Absorbed MQA core over 16 keys: QK over 128+16 dims, PV over 128, per head.
  EXPECT_REL(ops.at("attn.core").flops, L * 16 * 2 * 4 * (2 * 128 + 16));
  EXPECT_REL(ops.at("attn.core").bytes, L * (16 * 164 + 4 * (128 + 16) * 2 + 4 * 128 * 2));
  EXPECT_EQ(ops.at("attn.core").cls, OpClass::AttentionSparse);
  EXPECT_REL(ops.at("attn.v_up").flops, L * 2 * 4 * 128 * 32);
  EXPECT_REL(ops.at("attn.o_proj").flops, L * 2 * 256 * (4 * 32));
  EXPECT_REL(ops.at("attn.cache_write").bytes, L * 164);
  // Indexer: q from the q latent, one key, bf16 head weights, fp8 q.k over all 101 keys.
  EXPECT_REL(ops.at("indexer.wq_b").flops, L * 2 * (2 * 128) * 64);
  EXPECT_REL(ops.at("indexer.wk").flops, L * 2 * 128 * 256);
  EXPECT_REL(ops.at("indexer.wk").bytes, L * (128 * 256 * WB + 256 + 128 * 2 + 132));
  EXPECT_REL(ops.at("indexer.weights_proj").bytes, L * (2 * 256 * 2 + 256 * 2 + 2 * 2));
  EXPECT_REL(ops.at("indexer.score").flops, L * 101 * 2 * 2 * 128);
  EXPECT_REL(ops.at("indexer.score").bytes, L * (101 * 132 + 2 * 128 + 101 * 4));
  EXPECT_EQ(ops.at("indexer.score").bits, 8);
  EXPECT_REL(ops.at("indexer.topk").bytes, L * 101 * 4);
  EXPECT_REL(ops.at("indexer.topk").flops, L * 101);  // one selection step per scored key
  EXPECT_EQ(ops.at("indexer.topk").cls, OpClass::Topk);
  // Dense layer 0.
  EXPECT_EQ(ops.at("mlp.gate_up").count, 1);
  EXPECT_REL(ops.at("mlp.gate_up").flops, 2 * 1024 * 256);
  EXPECT_REL(ops.at("mlp.down").bytes, 256 * 512 * WB + 512 + 256 * 2);
  // MoE layers 1, 2: one token picks 2 of 8 experts, so 2 experts' weights are read.
  EXPECT_REL(ops.at("moe.router").flops, Lmoe * 2 * 8 * 256);
  EXPECT_REL(ops.at("moe.router").bytes, Lmoe * (8 * 256 * 2 + 256 * 2 + 8 * 2));
  const double hit = 8 * (1 - (1 - 2.0 / 8));  // = 2
  EXPECT_REL(ops.at("moe.experts_gate_up").flops, Lmoe * 2 * 2 * 128 * 256);
  EXPECT_REL(ops.at("moe.experts_gate_up").bytes, Lmoe * (hit * 128 * 256 * WB + 2 * 256 + 2 * 128 * 2));
  EXPECT_REL(ops.at("moe.experts_down").flops, Lmoe * 2 * 2 * 256 * 64);
  EXPECT_REL(ops.at("moe.experts_down").bytes, Lmoe * (hit * 256 * 64 * WB + 2 * 64 + 2 * 256 * 2));
  EXPECT_REL(ops.at("moe.shared_gate_up").flops, Lmoe * 2 * 128 * 256);
  EXPECT_REL(ops.at("moe.shared_down").flops, Lmoe * 2 * 256 * 64);
  EXPECT_EQ(ops.count("moe.dispatch"), 0u);  // ep 1: no all-to-all
  EXPECT_EQ(ops.count("tp.allreduce"), 0u);
  // Head: bf16 lm_head.
  EXPECT_REL(ops.at("lm_head").flops, 2 * 1000 * 256);
  EXPECT_REL(ops.at("lm_head").bytes, 1000 * 256 * 2 + 256 * 2 + 1000 * 2);
  EXPECT_REL(ops.at("embed").bytes, 256 * 2 * 2);
  EXPECT_REL(ops.at("layer.norms").bytes, L * (2 * 256 + 64 + 128) * 4);
  // Element-wise work: RoPE of 4 query heads + 1 key (16 dims, bf16 in and out); the
  // indexer's 2 query heads + 1 key of 128 (bf16 in, fp8 out); silu * up (gate and up in,
  // one out) over the dense layer's 512 and the MoE layers' 2 routed + 1 shared x 64.
  EXPECT_REL(ops.at("attn.rope").bytes, L * (4 + 1) * 16 * 2 * 2);
  EXPECT_REL(ops.at("attn.rope").flops, L * (4 + 1) * 16 * 3);
  EXPECT_EQ(ops.at("attn.rope").cls, OpClass::Memory);
  EXPECT_REL(ops.at("indexer.quant").bytes, L * (2 + 1) * 128 * 3);
  EXPECT_REL(ops.at("indexer.quant").flops, L * (2 + 1) * 128 * 10);
  EXPECT_REL(ops.at("mlp.act").bytes, 512 * 3 * 2);
  EXPECT_EQ(ops.at("mlp.act").count, 1);
  EXPECT_REL(ops.at("moe.act").bytes, Lmoe * (2 * 64 + 64) * 3 * 2);
  EXPECT_REL(ops.at("moe.act").flops, Lmoe * (2 * 64 + 64) * 4);
}

TEST(SimCost, DecodeBytesGrowOnlyThroughTheIndexerPastTopK) {
  const SimModel t = tiny();
  // Past top-k every extra cached token costs: its indexer key (132), its fp32 logit written
  // (4) and read by top-k (4), in each of the 3 layers. Sparse attention stays at 16 rows.
  EXPECT_REL(decode_bytes_per_token(t, 1100) - decode_bytes_per_token(t, 100), 1000.0 * 3 * (132 + 4 + 4));
  const SimModel v3 = load_model("deepseek-v3");
  // Dense MLA instead reads every latent row (656 B) and has no indexer.
  EXPECT_REL(decode_bytes_per_token(v3, 2000) - decode_bytes_per_token(v3, 1000), 1000.0 * 61 * 656);
}

TEST(SimCost, PrefillChoosesMhaForShortPromptsAndSparseForLongOnes) {
  const SimModel t = tiny();
  {
    // 8 tokens: MHA form costs 36 keys x 2*4*(48+32) + expansion 8 x 2*4*64*128 < absorbed.
    const auto ops = by_name(op_plan(t, Step{Phase::Prefill, 1, 8, 0}, Layout{}, Options{}));
    ASSERT_EQ(ops.count("attn.kv_b_proj"), 1u);
    EXPECT_EQ(ops.count("attn.q_absorb"), 0u);
    EXPECT_REL(ops.at("attn.core").flops, 3.0 * 36 * 2 * 4 * (48 + 32));
    EXPECT_REL(ops.at("attn.kv_b_proj").flops, 3.0 * 2 * 8 * (4 * 64) * 128);
    EXPECT_EQ(ops.at("attn.core").cls, OpClass::AttentionDense);
    EXPECT_REL(ops.at("lm_head").flops, 2.0 * 1 * 1000 * 256);  // only the last prompt token
    EXPECT_REL(ops.at("indexer.score").flops, 3.0 * 36 * 2 * 2 * 128);
  }
  {
    // 512 tokens with top-k 16: sparse keys 136 + 496*16 = 8072; MHA would need 131,328.
    const auto ops = by_name(op_plan(t, Step{Phase::Prefill, 1, 512, 0}, Layout{}, Options{}));
    ASSERT_EQ(ops.count("attn.q_absorb"), 1u);
    EXPECT_REL(ops.at("attn.core").flops, 3.0 * 8072 * 2 * 4 * (2 * 128 + 16));
    EXPECT_REL(ops.at("attn.core").bytes, 3.0 * (8072 * 164 + 512 * 4 * 144 * 2 + 512 * 4 * 128 * 2));
    EXPECT_REL(ops.at("indexer.score").flops, 3.0 * (512 * 513 / 2) * 2 * 2 * 128);
  }
  {
    // An engine that runs prefill absorbed (the CPU engine) does so for 8 tokens too: 36 keys
    // of the absorbed form, with the query and value products around them.
    Options absorbed;
    absorbed.absorbed_prefill = true;
    const auto ops = by_name(op_plan(t, Step{Phase::Prefill, 1, 8, 0}, Layout{}, absorbed));
    EXPECT_EQ(ops.count("attn.kv_b_proj"), 0u);
    ASSERT_EQ(ops.count("attn.q_absorb"), 1u);
    EXPECT_EQ(ops.count("attn.v_up"), 1u);
    EXPECT_REL(ops.at("attn.core").flops, 3.0 * 36 * 2 * 4 * (2 * 128 + 16));
    EXPECT_EQ(ops.at("attn.core").cls, OpClass::AttentionSparse);
    const SimModel v3 = load_model("deepseek-v3");
    const auto dense = by_name(op_plan(v3, Step{Phase::Prefill, 1, 8, 0}, Layout{}, absorbed));
    EXPECT_EQ(dense.count("attn.kv_b_proj"), 0u);
    EXPECT_EQ(dense.at("attn.core").cls, OpClass::AttentionDense);
  }
  // The helper agrees with the plan.
  EXPECT_REL(prefill_flops_per_token(t, 8), plan_total_flops(op_plan(t, Step{Phase::Prefill, 1, 8, 0}, Layout{}, Options{})) / 8);
}

TEST(SimCost, DenseModelDecodeReadsEveryKey) {
  const SimModel v3 = load_model("deepseek-v3");
  ASSERT_FALSE(v3.has_indexer);
  const auto ops = by_name(op_plan(v3, Step{Phase::Decode, 2, 1, 999}, Layout{}, Options{}));
  EXPECT_EQ(ops.count("indexer.score"), 0u);
  EXPECT_REL(ops.at("attn.core").flops, 61.0 * 2 * 1000 * 2 * 128 * (2 * 512 + 64));
  EXPECT_EQ(ops.at("attn.core").cls, OpClass::AttentionDense);
}

TEST(SimCost, TensorAndExpertParallelSplitsAndCommunication) {
  const SimModel t = tiny();
  Layout l;
  l.tp = 2;
  l.ep = 2;
  l.devices_per_node = 8;
  const double T = 4;  // 4 sequences x 1 token
  const auto ops = by_name(op_plan(t, Step{Phase::Decode, 4, 1, 10}, l, Options{}));
  EXPECT_REL(ops.at("attn.q_b_proj").flops, 3 * 2 * T * (2 * 48) * 64);  // 2 of 4 heads
  EXPECT_REL(ops.at("attn.q_a_proj").flops, 3 * 2 * T * 64 * 256);       // replicated
  EXPECT_REL(ops.at("mlp.gate_up").flops, 2 * T * (2 * 256) * 256);      // intermediate / 2
  // Experts: 4 tokens x 2 picks spread over 2 ranks -> 4 assignments, each full expert (moe_tp 1).
  EXPECT_REL(ops.at("moe.experts_gate_up").flops, 2 * 2 * 4 * 128 * 256);
  const double hit = 4 * (1 - std::pow(1 - 2.0 / 8, 4));
  EXPECT_REL(ops.at("moe.experts_gate_up").bytes, 2 * (hit * 128 * 256 * WB + 4 * 256 + 4 * 128 * 2));
  // Ring all-reduce after attention and after the MLP: 2(tp-1)/tp of 4 x 256 bf16.
  EXPECT_REL(ops.at("tp.allreduce").comm_intra, 3 * 2 * (2.0 * 1 / 2 * T * 256 * 2));
  EXPECT_EQ(ops.at("tp.allreduce").comm_inter, 0);
  // Dispatch: each device sends its 2 tokens x 2 picks x 1/2 remote, fp8 + scale; combine bf16.
  EXPECT_REL(ops.at("moe.dispatch").comm_intra, 2 * (2 * 2 * 0.5 * 256 * (1 + 4.0 / 128)));
  EXPECT_REL(ops.at("moe.combine").comm_intra, 2 * (2 * 2 * 0.5 * 256 * 2));
}

// The CPU engine's own collectives (model/mla.cpp, mlp.cpp, moe.cpp, forward.cpp): f32, but
// the MoE's partial outputs, which travel as doubles.
TEST(SimCost, EngineCollectivesGatherWholeOutputs) {
  const SimModel t = tiny();
  Options eng;
  eng.engine_collectives = true;
  Layout l;
  l.tp = 2;
  const double T = 4, H = 256;
  auto ops = by_name(op_plan(t, Step{Phase::Decode, 4, 1, 10}, l, eng));
  EXPECT_EQ(ops.count("tp.allreduce"), 0u);
  EXPECT_EQ(ops.count("moe.allreduce") + ops.count("moe.dispatch"), 0u);
  // Each gather brings the other member's half. Per layer the heads' outputs (4 x 32) and
  // o_proj's rows; the dense layer's intermediate (512) and rows; each MoE layer's shared
  // intermediate (64), its routed intermediates (2 picks x 64, every expert split) and rows.
  const double half = 0.5 * 4.0;
  const double attn = 3 * half * T * (4 * 32 + H), dense = half * T * (512 + H), moe = 2 * half * T * (64 + 2 * 64 + H);
  EXPECT_REL(ops.at("tp.allgather").comm_intra, attn + dense + moe);
  EXPECT_EQ(ops.at("tp.allgather").cls, OpClass::CommTP);
  // The embedding split by vocabulary rows and summed; the head's halves gathered.
  EXPECT_REL(ops.at("embed.allreduce").comm_intra, 2 * 0.5 * T * H * 4);
  EXPECT_REL(ops.at("head.allgather").comm_intra, 0.5 * T * 1000 * 4);

  // Whole experts over the same two ranks: every rank holds every token, so one all-reduce
  // per MoE layer, and only the shared expert's intermediate is gathered there.
  l.ep = 2;
  ops = by_name(op_plan(t, Step{Phase::Decode, 4, 1, 10}, l, eng));
  EXPECT_EQ(ops.count("moe.dispatch"), 0u);
  EXPECT_REL(ops.at("moe.allreduce").comm_intra, 2 * (2 * 0.5 * T * H * 8));
  EXPECT_REL(ops.at("tp.allgather").comm_intra, attn + dense + 2 * half * T * 64);

  // Data-parallel attention: a few tokens go to every member by all-gather and come back by
  // reduce-scatter, after every member's count.
  Layout dp;
  dp.dp = 2;
  dp.ep = 2;
  ops = by_name(op_plan(t, Step{Phase::Decode, 4, 1, 10}, dp, eng));
  EXPECT_EQ(ops.count("tp.allgather") + ops.count("moe.allreduce"), 0u);
  EXPECT_REL(ops.at("moe.dispatch").comm_intra, 2 * (0.5 * 2 * T * H * 4));
  EXPECT_REL(ops.at("moe.combine").comm_intra, 2 * (0.5 * 2 * T * H * 8));
  EXPECT_EQ(ops.at("moe.counts").comm_hops, 2 * 1);
  // Enough tokens over enough members: all-to-all, each token to the other members that own
  // one of its two experts (1 - (7/8)^2 of each), its hidden state and routes out, a row back.
  dp.dp = dp.ep = 8;
  ops = by_name(op_plan(t, Step{Phase::Decode, 16, 1, 10}, dp, eng));
  const double sent = 16 * 7 * (1 - std::pow(7.0 / 8, 2));
  EXPECT_REL(ops.at("moe.dispatch").comm_intra, 2 * sent * (H + 4) * 4);
  EXPECT_REL(ops.at("moe.combine").comm_intra, 2 * sent * H * 8);
  EXPECT_EQ(ops.at("moe.dispatch").comm_hops, 2 * 3 * 7);
  // Fewer tokens than the engine's threshold: all-gather again.
  ops = by_name(op_plan(t, Step{Phase::Decode, 4, 1, 10}, dp, eng));
  EXPECT_REL(ops.at("moe.dispatch").comm_intra, 2 * (7.0 / 8 * 8 * 4 * H * 4));
}

TEST(SimCost, ReplicatedAttentionAllReducesTheExpertsAndSplitsTheHead) {
  const SimModel t = tiny();
  Layout l;
  l.rep = 2;
  l.ep = 2;
  l.devices_per_node = 8;
  const double T = 4;
  const auto ops = by_name(op_plan(t, Step{Phase::Decode, 4, 1, 10}, l, Options{}));
  EXPECT_REL(ops.at("attn.q_b_proj").flops, 3 * 2 * T * (4 * 48) * 64);  // every head on every replica
  EXPECT_REL(ops.at("mlp.gate_up").flops, 2 * T * (2 * 512) * 256);      // the dense MLP whole
  // The 4 tokens' 8 picks over 2 ranks, each expert whole.
  EXPECT_REL(ops.at("moe.experts_gate_up").flops, 2 * 2 * 4 * 128 * 256);
  // No dispatch: one ring all-reduce of 4 x 256 fp32 per MoE layer (2 of the 3 layers).
  EXPECT_EQ(ops.count("moe.dispatch"), 0u);
  EXPECT_EQ(ops.count("tp.allreduce"), 0u);
  EXPECT_REL(ops.at("moe.allreduce").comm_intra, 2 * (2.0 * 1 / 2 * T * 256 * 4));
  EXPECT_EQ(ops.at("moe.allreduce").cls, OpClass::CommEP);
  // The head: half the vocabulary's rows per rank, then every rank gathers the other half.
  EXPECT_REL(ops.at("lm_head").flops, 2 * T * 500 * 256);
  EXPECT_REL(ops.at("head.allgather").comm_intra, 0.5 * T * 1000 * 4);
  EXPECT_EQ(l.devices(), 2);
  // Replicas and data-parallel groups are two answers to one question.
  Layout both = l;
  both.dp = 2;
  EXPECT_THROW(op_plan(t, Step{}, both, Options{}), dsa::Error);
}

TEST(SimCost, RedundantExpertsAreSlotsSharingTheAssignments) {
  const SimModel t = tiny();
  Layout l;
  l.dp = 3;
  l.ep = 3;
  EXPECT_THROW(op_plan(t, Step{Phase::Decode, 2, 1, 10}, l, Options{}), dsa::Error);  // 8 experts over 3 ranks
  l.redundant_experts = 1;  // 9 slots: 3 per rank
  const auto ops = by_name(op_plan(t, Step{Phase::Decode, 2, 1, 10}, l, Options{}));
  // 2 tokens per dp group x 3 groups x 2 picks = 12 assignments, 4 per rank; each of a rank's
  // 3 slots is hit with probability 1 - (1 - 2/9)^6.
  const double hit = 3 * (1 - std::pow(1 - 2.0 / 9, 6));
  EXPECT_REL(ops.at("moe.experts_gate_up").flops, 2 * 2 * 4 * 128 * 256);
  EXPECT_REL(ops.at("moe.experts_gate_up").bytes, 2 * (hit * 128 * 256 * WB + 4 * 256 + 4 * 128 * 2));
  EXPECT_REL(ops.at("moe.experts_down").bytes, 2 * (hit * 256 * 64 * WB + 4 * 64 + 4 * 256 * 2));
  // A model without routed experts has none to replicate.
  std::string dense = dsa::sim::test::kTinyJson;
  dense.replace(dense.find("\"n_routed_experts\": 8"), 21, "\"n_routed_experts\": 0");
  Layout d;
  d.redundant_experts = 4;
  EXPECT_THROW(op_plan(model_from_json_text(dense, "dense"), Step{}, d, Options{}), dsa::Error);
}

TEST(SimCost, ExpertParallelAcrossNodesUsesTheNetwork) {
  const SimModel t = tiny();
  Layout l;
  l.dp = 8;
  l.ep = 8;
  l.devices_per_node = 4;  // two nodes
  // Prefill (normal kernels): per token 2 picks x 3/8 go to other local ranks over NVLink;
  // the other node is hit with probability 1-(1/2)^2 and gets one RDMA copy.
  const auto pre = by_name(op_plan(t, Step{Phase::Prefill, 1, 1, 0}, l, Options{}));
  EXPECT_REL(pre.at("moe.dispatch").comm_intra, 2 * (2 * 3.0 / 8) * 256 * (1 + 4.0 / 128));
  EXPECT_REL(pre.at("moe.dispatch").comm_inter, 2 * (1 - 0.25) * 256 * (1 + 4.0 / 128));
  // Decode (low-latency kernels): every remote copy, 2 x 7/8, over RDMA.
  const auto dec = by_name(op_plan(t, Step{Phase::Decode, 1, 1, 10}, l, Options{}));
  EXPECT_EQ(dec.at("moe.dispatch").comm_intra, 0);
  EXPECT_REL(dec.at("moe.dispatch").comm_inter, 2 * (2 * 7.0 / 8) * 256 * (1 + 4.0 / 128));
  EXPECT_REL(dec.at("moe.combine").comm_inter, 2 * (2 * 7.0 / 8) * 256 * 2);
}

TEST(SimCost, PipelineStagesSplitTheLayersAndSendTheHiddenState) {
  const SimModel t = tiny();
  Layout l;
  l.pp = 3;
  l.devices_per_node = 8;
  // 2 sequences x 1 token; each of the 3 stages holds one of the 3 layers (count 1/3 of each
  // per-layer operator), the last one also the final norm and the head.
  const auto ops = by_name(op_plan(t, Step{Phase::Decode, 2, 1, 10}, l, Options{}));
  EXPECT_REL(ops.at("attn.q_a_proj").count, 1.0);
  EXPECT_REL(ops.at("attn.q_a_proj").flops, 2 * 2 * 64 * 256);
  EXPECT_REL(ops.at("moe.experts_gate_up").count, 2.0 / 3);
  EXPECT_REL(ops.at("final_norm").bytes, 2 * 256 * 2 * 2);  // bf16 in and out per logit row
  EXPECT_REL(ops.at("final_norm").flops, 2 * 4 * 256);
  EXPECT_REL(ops.at("lm_head").flops, 2 * 2 * 1000 * 256);
  // One send per stage boundary: the bf16 hidden state of every token, over NVLink while the
  // 3 devices share a node ...
  ASSERT_EQ(ops.count("pp.send"), 1u);
  EXPECT_EQ(ops.at("pp.send").cls, OpClass::CommPP);
  EXPECT_REL(ops.at("pp.send").comm_intra, 2 * 256 * 2);
  EXPECT_EQ(ops.at("pp.send").comm_inter, 0);
  EXPECT_REL(ops.at("pp.send").comm_hops, 1.0);
  // ... and over the network once the stages span nodes.
  l.devices_per_node = 2;
  const auto far = by_name(op_plan(t, Step{Phase::Decode, 2, 1, 10}, l, Options{}));
  EXPECT_EQ(far.at("pp.send").comm_intra, 0);
  EXPECT_REL(far.at("pp.send").comm_inter, 2 * 256 * 2);
  // No pipeline, no send.
  EXPECT_EQ(by_name(op_plan(t, Step{Phase::Decode, 2, 1, 10}, Layout{}, Options{})).count("pp.send"), 0u);
}

TEST(SimCost, MtpAddsDraftPassesAndVerifyTokens) {
  const SimModel t = tiny();
  Options o;
  o.mtp = 2;
  const auto ops = by_name(op_plan(t, Step{Phase::Decode, 1, 3, 50}, Layout{}, o));
  // Verify: 3 tokens through the main model, each with 16 sparse keys.
  EXPECT_REL(ops.at("attn.q_a_proj").flops, 3 * 2 * 3 * 64 * 256);
  EXPECT_REL(ops.at("attn.core").flops, 3 * (3 * 16) * 2 * 4 * 272);
  // Draft: the MTP layer (a MoE layer with its own indexer) twice, one token each.
  EXPECT_EQ(ops.at("mtp.attn.q_a_proj").count, 2);
  EXPECT_REL(ops.at("mtp.attn.q_a_proj").flops, 2 * 2 * 64 * 256);
  EXPECT_REL(ops.at("mtp.eh_proj").flops, 2 * 2 * 256 * 512);
  // enorm and hnorm over the embedding and the hidden state (2 x 256, bf16 in and out).
  EXPECT_REL(ops.at("mtp.norms").bytes, 2 * 2 * 256 * 2 * 2);
  EXPECT_REL(ops.at("mtp.lm_head").flops, 2 * 2 * 1000 * 256);
  EXPECT_REL(ops.at("mtp.indexer.score").flops, 2 * 51 * 2 * 2 * 128);
  EXPECT_EQ(ops.count("mtp.mlp.gate_up"), 0u);
  EXPECT_THROW(op_plan(load_model("v32-mini"), Step{Phase::Decode, 1, 2, 0}, Layout{}, o), dsa::Error);
}

TEST(SimCost, NvFp4KeepsAttentionInFp8) {
  const SimModel t = tiny();
  Options o;
  o.weight = WeightDtype::NVFP4;
  const auto ops = by_name(op_plan(t, Step{Phase::Decode, 1, 1, 0}, Layout{}, o));
  EXPECT_EQ(ops.at("attn.q_b_proj").bits, 8);
  EXPECT_EQ(ops.at("moe.experts_gate_up").bits, 4);
  EXPECT_REL(ops.at("moe.shared_down").bytes, 2 * (256 * 64 * (0.5 + 1.0 / 16) + 64 + 256 * 2));
}

TEST(SimCost, LayoutErrors) {
  const SimModel t = tiny();
  Layout l;
  l.tp = 3;
  EXPECT_THROW(op_plan(t, Step{}, l, Options{}), dsa::Error);  // 4 heads
  Layout e;
  e.dp = 2;
  e.ep = 3;
  EXPECT_THROW(op_plan(t, Step{}, e, Options{}), dsa::Error);
}

TEST(SimCost, BuiltinModels) {
  for (const auto& n : builtin_model_names()) EXPECT_NO_THROW(load_model(n)) << n;
  EXPECT_FALSE(load_model("deepseek-v3").has_indexer);
  EXPECT_TRUE(load_model("deepseek-v3.2").has_indexer);
  EXPECT_EQ(load_model("glm-5.2").cfg.num_full_indexer_layers(), 21);
  EXPECT_EQ(load_model("glm-5").cfg.num_full_indexer_layers(), 78);
  const SimModel mini = load_model("v32-mini");
  EXPECT_EQ(mini.cfg.num_hidden_layers, 8);
  EXPECT_EQ(mini.cfg.n_routed_experts, 64);
  EXPECT_EQ(mini.cfg.first_k_dense_replace, 1);
  EXPECT_THROW(load_model("no-such-model"), dsa::Error);
  // A V3/R1 config.json is accepted and costed without indexer.
  const SimModel r1 = model_from_json_text(builtin_model_json("deepseek-v3"), "r1");
  EXPECT_FALSE(r1.has_indexer);
}
