// Memory planner (hand-computed weights, workspace and cache capacity), hardware profiles,
// the per-op timing rule, the serving figures, the JSON contract and the probes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include "core/error.h"
#include "fixtures.h"
#include "sim/memory.h"
#include "sim/probe.h"
#include "sim/report.h"
#include "sim/search.h"
#include "sim/simulate.h"
#include "tiny.h"

using namespace dsa::sim;
using dsa::sim::test::tiny;

namespace {

const double WB = 1.0 + 4.0 / 16384.0;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

#define EXPECT_REL(a, b) EXPECT_NEAR((a), (b), std::abs(b) * 1e-12 + 1e-9)

// A made-up device with round numbers so that times can be written down by hand.
Hardware toy() {
  return hardware_from_json_text(R"({"name": "toy", "bf16_tflops": 1, "fp8_tflops": 2, "memory_bandwidth_gbps": 100,
    "memory_gib": 1, "memory_usable_fraction": 0.5, "memory_reserve_gib": 0.125, "devices_per_node": 4,
    "intra_node_bandwidth_gbps": 100, "intra_node_latency_us": 3, "inter_node_bandwidth_gbps": 10,
    "inter_node_latency_us": 7, "launch_overhead_us": 1, "price_per_hour": 3.6,
    "efficiency": {"gemm": 0.5, "memory": 0.8, "comm": 0.8, "attention_sparse_decode": 0.25, "sustained": 1}})",
                                 "toy");
}

// An operator as the timing tests build one: the fields a test leaves out stay zero.
Op make_op(const char* name, OpClass cls, int bits, double count, double flops = 0, double bytes = 0) {
  return Op{.name = name, .cls = cls, .bits = bits, .count = count, .flops = flops, .bytes = bytes, .shape = {}};
}

}  // namespace

TEST(SimMemory, WeightsPerDevice) {
  const SimModel t = tiny();
  const WeightBytes w = weight_bytes_per_device(t, Layout{}, Options{});
  // q_a [64,256], kv_a [144,256], q_b [4*48,64], kv_b [4*64,128], o [256,4*32] per layer.
  EXPECT_REL(w.attention, 3 * WB * (256 * 64 + 256 * 144 + 64 * 4 * 48 + 128 * 4 * 64 + 4 * 32 * 256));
  // wq_b [256,64], wk [128,256] fp8; weights_proj [2,256] bf16; k_norm weight+bias fp32.
  EXPECT_REL(w.indexer, 3 * (WB * (64 * 256 + 256 * 128) + 2 * 256 * 2 + 4 * 2 * 128));
  EXPECT_REL(w.dense_mlp, WB * 3 * 256 * 512);
  EXPECT_REL(w.routed_experts, 2 * WB * 3 * 256 * 64 * 8);
  EXPECT_REL(w.shared_experts, 2 * WB * 3 * 256 * 64);
  EXPECT_REL(w.router, 2 * (2 * 8 * 256 + 4 * 8));
  EXPECT_REL(w.embed_head, 2 * 1000 * 256 * 2);
  EXPECT_REL(w.norms, 3 * 2 * (2 * 256 + 64 + 128) + 2 * 256);
  EXPECT_EQ(w.mtp, 0);

  Layout ep;
  ep.dp = 2;
  ep.ep = 2;
  const WeightBytes we = weight_bytes_per_device(t, ep, Options{});
  EXPECT_REL(we.routed_experts, w.routed_experts / 2);  // 4 of 8 experts per device
  EXPECT_REL(we.attention, w.attention);                // attention replicated under dp

  Layout rep;  // the engine's --ep 2 without --dp: everything but the experts and the head whole
  rep.rep = 2;
  rep.ep = 2;
  const WeightBytes wr = weight_bytes_per_device(t, rep, Options{});
  EXPECT_REL(wr.routed_experts, w.routed_experts / 2);
  EXPECT_REL(wr.attention, w.attention);
  EXPECT_REL(wr.dense_mlp, w.dense_mlp);
  EXPECT_REL(wr.embed_head, 1000 * 256 * 2 * 1.5);  // the embedding and half the head

  Layout red;  // 8 experts + 1 redundant replica = 9 slots over 3 ranks: 3 experts' weights each
  red.dp = 3;
  red.ep = 3;
  red.redundant_experts = 1;
  EXPECT_REL(weight_bytes_per_device(t, red, Options{}).routed_experts, w.routed_experts * 3 / 8);

  Layout tp;
  tp.tp = 2;
  tp.ep = 2;
  const WeightBytes wt = weight_bytes_per_device(t, tp, Options{});
  EXPECT_REL(wt.attention, 3 * WB * (256 * 64 + 256 * 144 + 64 * 2 * 48 + 128 * 2 * 64 + 2 * 32 * 256));
  EXPECT_REL(wt.embed_head, w.embed_head / 2);

  Options bf;
  bf.weight = WeightDtype::BF16;
  EXPECT_REL(weight_bytes_per_device(t, Layout{}, bf).dense_mlp, 2.0 * 3 * 256 * 512);
}

TEST(SimMemory, RealModelWeightsAreAboutTheCheckpointSize) {
  // DeepSeek-V3.2 main layers in fp8 hold about 671B parameters, i.e. roughly 640-690 GB on
  // one device's worth of weights (embed and head bf16).
  const double total = weight_bytes_per_device(load_model("deepseek-v3.2"), Layout{}, Options{}).total();
  EXPECT_GT(total, 640e9);
  EXPECT_LT(total, 700e9);
}

TEST(SimMemory, WorkspaceAndCacheCapacity) {
  const SimModel t = tiny();
  // Per token: 2*(4*256 + 4*48 + 144 + 4*32 + max(2*512, 2*2*64)) + 2*2*256 = 6048 bytes;
  // 16 prefill tokens, plus fp32 logits of 4 decode tokens, plus 16x16 fp32 indexer logits.
  const double ws = activation_workspace_bytes(t, Layout{}, Options{}, 4, 16, 0);
  EXPECT_REL(ws, 16 * 6048.0 + 4 * 1000 * 4.0 + 16 * 16 * 4.0);
  const MemoryPlan p = plan_memory(t, toy(), Layout{}, Options{}, 4, 16, 0);
  const double weights = weight_bytes_per_device(t, Layout{}, Options{}).total();
  EXPECT_REL(p.usable_bytes, 0.5 * kGiB);
  EXPECT_REL(p.cache_budget_bytes, 0.5 * kGiB - 0.125 * kGiB - weights - ws);
  EXPECT_EQ(p.cache_bytes_per_token, 3 * (164 + 132));
  EXPECT_EQ(p.max_cached_tokens_per_device, int64_t(std::floor(p.cache_budget_bytes / 888.0)));
  EXPECT_TRUE(p.fits);
  EXPECT_EQ(p.max_seqs_per_device(1000, 1), p.max_cached_tokens_per_device / 1000);
  Layout pp;
  pp.pp = 3;
  EXPECT_EQ(plan_memory(t, toy(), pp, Options{}, 4, 16, 0).cache_bytes_per_token_per_device, 296);
  // The full DeepSeek-V3.2 does not fit on one toy device.
  const MemoryPlan big = plan_memory(load_model("deepseek-v3.2"), toy(), Layout{}, Options{}, 1, 1, 0);
  EXPECT_FALSE(big.fits);
  EXPECT_EQ(big.max_cached_tokens_per_device, 0);
}

TEST(SimHardware, BuiltinsAndUserProfiles) {
  for (const auto& n : builtin_hardware_names()) {
    if (n == "local") continue;
    const Hardware h = load_hardware(n);
    EXPECT_GT(h.bf16_tflops, 0) << n;
    EXPECT_GT(h.price_per_hour, 0) << n;
    // Round trip through the JSON a user would edit.
    EXPECT_EQ(hardware_from_json_text(hardware_to_json(h), n).memory_bandwidth_gbps, h.memory_bandwidth_gbps);
  }
  EXPECT_EQ(load_hardware("Ascend 910B").name, "ascend-910b");
  EXPECT_EQ(load_hardware("H200").memory_bandwidth_gbps, 4800);
  EXPECT_THROW(load_hardware("tpu-v9"), dsa::Error);
  EXPECT_THROW(hardware_from_json_text(R"({"bf16_tflops": 1, "memory_bandwidth_gbps": 1, "memory_gib": 1,
                                          "efficiency": {"gemm": 1.5}})", "x"), dsa::Error);
  EXPECT_THROW(hardware_from_json_text(R"({"memory_bandwidth_gbps": 1, "memory_gib": 1})", "x"), dsa::Error);
  // A profile's mistakes are named: wrong types, misspelt keys, impossible values.
  const std::string ok = R"({"bf16_tflops": 1, "memory_bandwidth_gbps": 1, "memory_gib": 100, "devices_per_node": 1)";
  EXPECT_NO_THROW(hardware_from_json_text(ok + "}", "x"));
  for (const auto& [extra, needle] : std::vector<std::pair<std::string, std::string>>{
           {R"(, "name": 7})", "'name'"},
           {R"(, "launch_overhead_us": -100})", "'launch_overhead_us'"},
           {R"(, "price_per_hour": -3})", "'price_per_hour'"},
           {R"(, "memory_reserve_gib": 500})", "'memory_reserve_gib'"}}) {
    try {
      hardware_from_json_text(ok + extra, "p.json");
      ADD_FAILURE() << "accepted " << extra;
    } catch (const dsa::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("p.json"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(hardware_from_json_text(R"({"bf16_tflops": 1, "memory_bandwidth_gbps": 1, "memory_gib": 1e300, "devices_per_node": 1})", "x"),
               dsa::Error);
  EXPECT_THROW(hardware_from_json_text(R"({"bf16_tflops": 1, "memory_bandwidth_gbps": 1, "memory_gib": 1, "devices_per_node": 8.5})", "x"),
               dsa::Error);
  const Hardware t = toy();
  EXPECT_EQ(t.peak_flops(16), 1e12);
  EXPECT_EQ(t.peak_flops(8), 2e12);
  EXPECT_EQ(t.peak_flops(4), 2e12);  // no fp4 units: fp8 rate
}

TEST(SimTiming, RooflinePlusOverheadCommAndKernelTable) {
  const Hardware hw = toy();
  Op op = make_op("x", OpClass::Gemm, 8, 2, 1e9, 1e6);
  // compute 1e9 / (2e12 * 0.5) = 1000 us; memory 1e6 / (100e9 * 0.8) = 12.5 us; + 2 launches.
  OpTime t = time_op(op, hw, nullptr);
  EXPECT_REL(t.compute_us, 1000.0);
  EXPECT_REL(t.memory_us, 12.5);
  EXPECT_REL(t.time_us, 1002.0);
  EXPECT_EQ(t.bound, "compute");
  op.flops = 1e6;
  t = time_op(op, hw, nullptr);
  EXPECT_EQ(t.bound, "memory");
  EXPECT_REL(t.time_us, 12.5 + 2);
  Hardware cpu = hw;
  cpu.dequant_flops_per_weight = 8;
  op.weight_elems = 1e8;  // + 8e8 FLOP-equivalents of widening
  EXPECT_REL(time_op(op, cpu, nullptr).compute_us, (1e6 + 8e8) / (2e12 * 0.5) * 1e6);

  Op c = make_op("moe.dispatch", OpClass::CommEP, 16, 1);
  c.comm_intra = 1e9;
  c.comm_hops = 2;
  EXPECT_REL(time_op(c, hw, nullptr).time_us, 1e9 / (100e9 * 0.8) * 1e6 + 2 * 3);
  c.comm_inter = 1e8;  // network: 1e8 / (10e9 * 0.8) = 12500 us, in parallel with NVLink's 12500
  EXPECT_REL(time_op(c, hw, nullptr).time_us, 12500.0 + 2 * 7);

  const KernelTable kt = kernel_table_from_csv("op,shape,latency_us\nx,M=1;N=2;K=3,7.5\nx,M=9;N=9;K=9,1\n", "t.csv");
  op.shape = "M=1;N=2;K=3";
  t = time_op(op, hw, &kt);
  EXPECT_EQ(t.bound, "measured");
  EXPECT_REL(t.time_us, 15.0);
  op.shape = "M=2;N=2;K=3";
  EXPECT_NE(time_op(op, hw, &kt).bound, "measured");
  // The row for M=9 never matched: the command reports it rather than ignoring it.
  EXPECT_EQ(kt.matched.size(), 1u);
  EXPECT_EQ(kt.latency_us.size(), 2u);
  EXPECT_THROW(kernel_table_from_csv("x,1\n", "t.csv"), dsa::Error);
  EXPECT_THROW(kernel_table_from_csv("x,y,inf\n", "t.csv"), dsa::Error);
  EXPECT_THROW(kernel_table_from_csv("x,y,5us\n", "t.csv"), dsa::Error);
}

TEST(SimTiming, PackingCountsFromFourRowsPerWeight) {
  Hardware cpu = toy();
  cpu.dequant_flops_per_weight = 6;
  cpu.pack_flops_per_weight = 20;
  Op op = make_op("x", OpClass::Gemm, 8, 1);
  op.weight_elems = 1e6;
  // 3 rows per weight: the streaming GEMV path, widening only: (6e6 + 6e6) / (2e12 * 0.5).
  op.flops = 2.0 * 3 * 1e6;
  EXPECT_REL(time_op(op, cpu, nullptr).compute_us, (6e6 + 6e6) / 1e12 * 1e6);
  // 4 rows: the packed GEMM, widening and packing: (8e6 + 26e6) / 1e12.
  op.flops = 2.0 * 4 * 1e6;
  EXPECT_REL(time_op(op, cpu, nullptr).compute_us, (8e6 + 26e6) / 1e12 * 1e6);
}

TEST(SimTiming, SustainedFactorDiscountsComputeOnly) {
  Hardware hw = toy();
  hw.eff.sustained = 0.25;
  Op op = make_op("x", OpClass::Gemm, 8, 1, 1e9, 1e9);
  // compute 1e9 / (2e12 * 0.5 * 0.25) = 4000 us; memory 1e9 / (100e9 * 0.8) = 12500 us, as
  // without the factor: it discounts FLOP rates only.
  OpTime t = time_op(op, hw, nullptr);
  EXPECT_REL(t.compute_us, 4000.0);
  EXPECT_REL(t.memory_us, 12500.0);
  EXPECT_EQ(t.bound, "memory");
  op.cls = OpClass::AttentionDense;
  op.phase = Phase::Decode;
  op.bits = 16;
  op.bytes = 0;  // 1e9 / (1e12 * 0.67 * 0.25)
  EXPECT_REL(time_op(op, hw, nullptr).compute_us, 1e9 / (1e12 * hw.eff.attention_dense * 0.25) * 1e6);
  Op c = make_op("moe.combine", OpClass::CommEP, 16, 1);
  c.comm_intra = 1e9;
  EXPECT_REL(time_op(c, hw, nullptr).time_us, time_op(c, toy(), nullptr).time_us);
  // A measured latency stays what was measured.
  const KernelTable kt = kernel_table_from_csv("op,shape,latency_us\nx,M=1,7.5\n", "t.csv");
  op.name = "x";
  op.shape = "M=1";
  EXPECT_REL(time_op(op, hw, &kt).time_us, 7.5);
  // The profile JSON carries it; a profile without it gets the accelerators' default.
  EXPECT_EQ(hardware_from_json_text(hardware_to_json(hw), "back").eff.sustained, 0.25);
  const std::string bare = R"({"bf16_tflops": 1, "memory_bandwidth_gbps": 1, "memory_gib": 100, "devices_per_node": 1})";
  EXPECT_EQ(hardware_from_json_text(bare, "bare").eff.sustained, Efficiency{}.sustained);
  for (const char* bad : {"0", "1.5", "-1"})
    EXPECT_THROW(hardware_from_json_text(std::string(R"({"bf16_tflops": 1, "memory_bandwidth_gbps": 1, "memory_gib": 100,
      "devices_per_node": 1, "efficiency": {"sustained": )") + bad + "}}", "x"), dsa::Error) << bad;
}

TEST(SimTiming, TopkAndIndexerUseTheirOwnFactors) {
  Hardware hw = toy();
  hw.eff.indexer = 0.25;
  hw.eff.topk = 0.001;
  Op op = make_op("indexer.topk", OpClass::Topk, 16, 1, 1e6 /* keys */, 4e6);
  // 1e6 / (1e12 * 0.001) = 1000 us against 4e6 / (100e9 * 0.8) = 50 us, + 1 launch.
  EXPECT_REL(time_op(op, hw, nullptr).time_us, 1001.0);
  op.cls = OpClass::Indexer;
  op.bits = 8;
  op.flops = 1e9;  // 1e9 / (2e12 * 0.25) = 2000 us
  EXPECT_REL(time_op(op, hw, nullptr).compute_us, 2000.0);
  // Element-wise ops stream at their own factor: 4e6 / (100e9 * 0.02) = 2000 us, + 1 launch.
  hw.eff.elementwise = 0.02;
  op.cls = OpClass::Memory;
  op.flops = 0;
  EXPECT_REL(time_op(op, hw, nullptr).time_us, 2001.0);
  EXPECT_EQ(time_op(op, hw, nullptr).bound, "memory");
  // Per-head products at theirs: 1e9 / (2e12 * 0.125) = 4000 us.
  hw.eff.gemm_heads = 0.125;
  op.cls = OpClass::Gemm;
  op.bytes = 0;
  op.flops = 1e9;
  op.per_head = true;
  EXPECT_REL(time_op(op, hw, nullptr).compute_us, 4000.0);
  op.per_head = false;  // 1e9 / (2e12 * 0.5) = 1000 us
  EXPECT_REL(time_op(op, hw, nullptr).compute_us, 1000.0);
  // Round trip through the profile JSON.
  const Hardware back = hardware_from_json_text(hardware_to_json(hw), "back");
  EXPECT_EQ(back.eff.indexer, 0.25);
  EXPECT_EQ(back.eff.topk, 0.001);
  EXPECT_EQ(back.eff.elementwise, 0.02);
  EXPECT_EQ(back.eff.gemm_heads, 0.125);
  // A profile that gives no element-wise factor uses its memory factor, and none for the
  // per-head products its GEMM factor.
  EXPECT_EQ(toy().eff.elementwise, 0.8);
  EXPECT_EQ(toy().eff.gemm_heads, 0.5);
}

TEST(SimHardware, LocalProfileFromKernelRates) {
  // Made-up measurements with a known answer: FMA peak 100 GFLOP/s, GEMMs at e = 0.5 with
  // d = 8 FLOP-equivalents of widening and p = 24 of packing per weight and call.
  KernelRates k;
  k.gemv_bf16_gbps = 18;                               // / 20 GB/s read -> memory 0.9
  k.gemm_small_gflops = 96.0 / ((96.0 + 32) / 50e9) / 1e9;    // 48 rows: (96 + 32) / 50e9 s per weight
  k.gemm_large_gflops = 1024.0 / ((1024.0 + 32) / 50e9) / 1e9;  // 512 rows
  k.gemm_heads_gflops = 1024.0 / ((1024.0 + 32) / 40e9) / 1e9;  // per head, 512 rows: e = 0.4
  k.gemv_fp8_gbps = 50.0 / (2 + 8) * (1 + 4.0 / 16384);  // (2 + d) / 50e9 s per weight, 1 + 4/128^2 bytes each
  // The decode GEMV: a + b n s per weight for n tokens, b = 2 / (0.25 x 100e9) = 8e-11 s,
  // a = 2e-10 - b = 1.2e-10 s (so one token matches the GEMV above): 2a / b = 3.
  k.gemv_fp8_tokens_gflops = 2.0 * kGemvTokens / (1.2e-10 + kGemvTokens * 8e-11) / 1e9;
  k.indexer_gflops = 10;
  k.topk_keys_per_s = 50e6;
  k.sparse_decode_gflops = 20;
  k.prefill_attention_gflops = 5;
  // The bf16 decode tile: one token at 18 GB/s is 2 / 18e9 s per weight = a + b, with
  // b = 2 / (0.4 x 100e9) = 5e-11 s per further token: 2a / b = 2 (2 / 18e9 - 5e-11) / 5e-11.
  const double bf16_b = 5e-11, bf16_a = 2.0 / 18e9 - bf16_b;
  k.gemv_bf16_tokens_gflops = 2.0 * kGemvTokens / (bf16_a + kGemvTokens * bf16_b) / 1e9;
  // Past kGemvTokens each further token costs more: bf16 1e-10 s per weight (e = 0.2), fp8
  // 8.5e-11 s (e = 2 / 8.5).
  const double bf16_t16 = bf16_a + kGemvTokens * bf16_b, fp8_t16 = 1.2e-10 + kGemvTokens * 8e-11;
  k.gemv_bf16_many_gflops = 2.0 * kGemvTokensMany / (bf16_t16 + (kGemvTokensMany - kGemvTokens) * 1e-10) / 1e9;
  k.gemv_fp8_many_gflops = 2.0 * kGemvTokensMany / (fp8_t16 + (kGemvTokensMany - kGemvTokens) * 8.5e-11) / 1e9;
  k.call_overhead_us = 3;
  k.elementwise_gbps = 1;  // / 20 GB/s -> 0.05
  const Hardware h = local_hardware_from(2, 20, 100, k);
  EXPECT_NEAR(h.eff.memory, 0.9, 1e-12);
  EXPECT_NEAR(h.eff.gemm, 0.5, 1e-12);
  EXPECT_NEAR(h.eff.gemm_heads, 0.4, 1e-12);
  EXPECT_NEAR(h.dequant_flops_per_weight, 8, 1e-9);
  EXPECT_NEAR(h.pack_flops_per_weight, 24, 1e-9);
  EXPECT_NEAR(h.decode_gemv_efficiency, 0.25, 1e-9);
  EXPECT_NEAR(h.decode_gemv_flops_per_weight, 3, 1e-6);
  EXPECT_NEAR(h.eff.indexer, 0.1, 1e-12);
  EXPECT_NEAR(h.eff.topk, 5e-4, 1e-15);
  EXPECT_NEAR(h.eff.attention_sparse_decode, 0.2, 1e-12);
  // One probe of the engine's absorbed prefill attention, for sparse and dense models.
  EXPECT_TRUE(h.prefill_absorbed);
  EXPECT_TRUE(h.engine_collectives);  // its ranks run this engine's collectives
  EXPECT_NEAR(h.eff.attention_sparse_prefill, 0.05, 1e-12);
  EXPECT_NEAR(h.eff.attention_dense_prefill, 0.05, 1e-12);
  EXPECT_NEAR(h.decode_gemv_bf16_efficiency, 0.4, 1e-9);
  EXPECT_NEAR(h.decode_gemv_bf16_flops_per_weight, 2.0 * bf16_a / bf16_b, 1e-6);
  EXPECT_EQ(h.decode_gemv_bend_tokens, kGemvTokens);
  EXPECT_NEAR(h.decode_gemv_bf16_many_efficiency, 0.2, 1e-9);
  EXPECT_NEAR(h.decode_gemv_many_efficiency, 2.0 / 8.5, 1e-9);
  EXPECT_EQ(h.launch_overhead_us, 3);
  EXPECT_NEAR(h.eff.elementwise, 0.05, 1e-12);
  EXPECT_EQ(h.eff.sustained, 1.0);  // the probes already time the kernels as the engine runs them
  EXPECT_EQ(h.peak_flops(8), 100e9);
  // The profile then reproduces its own probes: the 512-row GEMM (prefill), the fp8 GEMV of
  // one token and of kGemvTokens tokens (decode).
  Op g = make_op("g", OpClass::Gemm, 8, 1);
  g.phase = Phase::Prefill;
  g.weight_elems = 1024.0 * 2048;
  g.flops = 2.0 * 512 * g.weight_elems;
  EXPECT_NEAR(time_op(g, h, nullptr).compute_us, g.flops / (k.gemm_large_gflops * 1e9) * 1e6, 1e-6);
  // The per-head products' probe, through an op of the same rows per weight.
  g.per_head = true;
  EXPECT_NEAR(time_op(g, h, nullptr).compute_us, g.flops / (k.gemm_heads_gflops * 1e9) * 1e6, 1e-6);
  g.per_head = false;
  g.phase = Phase::Decode;
  g.flops = 2.0 * g.weight_elems;
  g.bytes = g.weight_elems * (1 + 4.0 / 16384);
  EXPECT_NEAR(time_op(g, h, nullptr).compute_us, g.bytes / (k.gemv_fp8_gbps * 1e9) * 1e6, 1e-6);
  g.flops = 2.0 * kGemvTokens * g.weight_elems;
  EXPECT_NEAR(time_op(g, h, nullptr).compute_us, g.flops / (k.gemv_fp8_tokens_gflops * 1e9) * 1e6, 1e-6);
  g.flops = 2.0 * 4 * g.weight_elems;  // four tokens: (2 x 4 + 3) / 25e9 s per weight
  EXPECT_NEAR(time_op(g, h, nullptr).compute_us, 11.0 / 25e9 * g.weight_elems * 1e6, 1e-6);
  g.flops = 2.0 * kGemvTokensMany * g.weight_elems;  // the second line, through the many-token probe
  EXPECT_NEAR(time_op(g, h, nullptr).compute_us, g.flops / (k.gemv_fp8_many_gflops * 1e9) * 1e6, 1e-6);
  // A bf16 decode product reproduces the bf16 probes, one token (at the GEMV's bandwidth)
  // and kGemvTokens; between them the line: four tokens (2 x 4 + 2a / b) / (0.4 x 100e9).
  Op bf = make_op("lm_head", OpClass::Gemm, 16, 1);
  bf.weight_elems = 4096.0 * 2048;
  bf.flops = 2.0 * kGemvTokens * bf.weight_elems;
  EXPECT_NEAR(time_op(bf, h, nullptr).compute_us, bf.flops / (k.gemv_bf16_tokens_gflops * 1e9) * 1e6, 1e-6);
  bf.flops = 2.0 * bf.weight_elems;
  bf.bytes = 2.0 * bf.weight_elems;
  EXPECT_NEAR(time_op(bf, h, nullptr).time_us - h.launch_overhead_us, bf.bytes / (k.gemv_bf16_gbps * 1e9) * 1e6, 1e-6);
  bf.flops = 2.0 * 4 * bf.weight_elems;
  EXPECT_NEAR(time_op(bf, h, nullptr).compute_us, (8.0 + 2.0 * bf16_a / bf16_b) / 40e9 * bf.weight_elems * 1e6, 1e-6);
  bf.flops = 2.0 * kGemvTokensMany * bf.weight_elems;
  EXPECT_NEAR(time_op(bf, h, nullptr).compute_us, bf.flops / (k.gemv_bf16_many_gflops * 1e9) * 1e6, 1e-6);
  bf.flops = 2.0 * 32 * bf.weight_elems;  // between the two probes, on the second line
  EXPECT_NEAR(time_op(bf, h, nullptr).compute_us, (bf16_t16 + 16 * 1e-10) * bf.weight_elems * 1e6, 1e-6);
  g.flops = 2.0 * 32 * g.weight_elems;
  EXPECT_NEAR(time_op(g, h, nullptr).compute_us, (fp8_t16 + 16 * 8.5e-11) * g.weight_elems * 1e6, 1e-6);
  // The profile's JSON carries the bf16 line and the attention form.
  const Hardware back = hardware_from_json_text(hardware_to_json(h), "back");
  EXPECT_TRUE(back.prefill_absorbed);
  EXPECT_TRUE(back.engine_collectives);
  EXPECT_FALSE(load_hardware("h200").engine_collectives);  // the GPU frameworks' collectives
  EXPECT_EQ(back.decode_gemv_bf16_efficiency, h.decode_gemv_bf16_efficiency);
  EXPECT_EQ(back.decode_gemv_bf16_flops_per_weight, h.decode_gemv_bf16_flops_per_weight);
  EXPECT_EQ(back.decode_gemv_bf16_many_efficiency, h.decode_gemv_bf16_many_efficiency);
  EXPECT_EQ(back.decode_gemv_many_efficiency, h.decode_gemv_many_efficiency);
  EXPECT_EQ(back.decode_gemv_bend_tokens, h.decode_gemv_bend_tokens);
  std::string bad = hardware_to_json(h);
  bad.replace(bad.find("\"prefill_absorbed\": true"), 24, "\"prefill_absorbed\": 1");
  EXPECT_THROW(hardware_from_json_text(bad, "bad"), dsa::Error);
  bad = hardware_to_json(h);
  bad.replace(bad.find("\"engine_collectives\": true"), 26, "\"engine_collectives\": \"yes\"");
  EXPECT_THROW(hardware_from_json_text(bad, "bad"), dsa::Error);
  // Without that probe decode products are costed as the GEMM model says.
  KernelRates old = k;
  old.gemv_fp8_tokens_gflops = 0;
  EXPECT_EQ(local_hardware_from(2, 20, 100, old).decode_gemv_efficiency, 0);
  // A bf16 GEMV faster than the read probe sets the bandwidth itself.
  KernelRates fast = k;
  fast.gemv_bf16_gbps = 25;
  const Hardware hf = local_hardware_from(2, 20, 100, fast);
  EXPECT_EQ(hf.memory_bandwidth_gbps, 25);
  EXPECT_EQ(hf.eff.memory, 1.0);
  // A one-token bf16 GEMV that waits on memory: kGemvTokens tokens cost less per further
  // token than the FMA peak allows (2 / 100e9 = 2e-11 s a weight), so the line through the
  // one-token point would put every token's FMAs too low. Efficiency 1; the kGemvTokens
  // probe sets the per-weight work and is reproduced; one token takes the bandwidth's time.
  KernelRates mem = k;
  mem.gemv_bf16_gbps = 18;
  const double mem_tn = 2.0 / 18e9 + (kGemvTokens - 1) * 1.5e-11;
  mem.gemv_bf16_tokens_gflops = 2.0 * kGemvTokens / mem_tn / 1e9;
  const Hardware hm = local_hardware_from(2, 20, 100, mem);
  EXPECT_EQ(hm.decode_gemv_bf16_efficiency, 1.0);
  EXPECT_NEAR(hm.decode_gemv_bf16_flops_per_weight, mem_tn * 100e9 - 2.0 * kGemvTokens, 1e-6);
  bf.flops = 2.0 * kGemvTokens * bf.weight_elems;
  EXPECT_NEAR(time_op(bf, hm, nullptr).compute_us, bf.flops / (mem.gemv_bf16_tokens_gflops * 1e9) * 1e6, 1e-6);
  bf.flops = 2.0 * bf.weight_elems;
  const OpTime one = time_op(bf, hm, nullptr);
  EXPECT_EQ(one.bound, "memory");
  EXPECT_NEAR(one.time_us - hm.launch_overhead_us, bf.bytes / (mem.gemv_bf16_gbps * 1e9) * 1e6, 1e-6);
  // Noise that makes the small GEMM faster per row than the large one: no per-call terms.
  KernelRates n = k;
  n.gemm_small_gflops = 2 * n.gemm_large_gflops;
  const Hardware hn = local_hardware_from(2, 20, 100, n);
  EXPECT_EQ(hn.pack_flops_per_weight, 0);
  EXPECT_EQ(hn.dequant_flops_per_weight, 0);
  EXPECT_NEAR(hn.eff.gemm, n.gemm_large_gflops / 100, 1e-12);
  // No per-head measurement: those products take the large GEMM's efficiency.
  n.gemm_heads_gflops = 0;
  EXPECT_EQ(local_hardware_from(2, 20, 100, n).eff.gemm_heads, hn.eff.gemm);
}

// One sequence: a 64-token prompt and 8 tokens out.
static PlanRequest one_short_sequence() {
  PlanRequest r;
  r.batch = 1;
  r.input_len = 64;
  r.output_len = 8;
  return r;
}

TEST(SimPlan, CacheHitsAreAttendedNotComputed) {
  const SimModel t = tiny();
  const Hardware hw = toy();
  PlanRequest r = one_short_sequence();
  r.cache_hit = 0.25;
  const PlanResult p = simulate(t, hw, r);
  // 16 of 64 prompt tokens are cached: the step computes 48 new ones after them.
  EXPECT_EQ(p.prefill.step.new_tokens, 48);
  EXPECT_EQ(p.prefill.step.context, 16);
  const PhaseResult same = cost_step(t, hw, p.layout, r.opt, Step{Phase::Prefill, 1, 48, 16}, nullptr, true);
  EXPECT_REL(p.prefill.step_us, same.step_us);
  const int dev = p.layout.devices();
  EXPECT_REL(p.prefill_tokens_per_s_per_device, 64.0 * p.layout.dp / (p.prefill.step_us / 1e6) / dev);
  EXPECT_REL(p.prefill_computed_tokens_per_s_per_device, 48.0 * p.layout.dp / (p.prefill.step_us / 1e6) / dev);
  r.cache_hit = 1.0;
  EXPECT_THROW(simulate(t, hw, r), dsa::Error);
}

TEST(SimPlan, LongPromptsPrefillInChunks) {
  // A 64-token prompt in chunks of 16: four steps, each attending to the chunks before it;
  // TTFT and every operator row sum them, and the workspace holds one chunk, not the prompt.
  const SimModel t = tiny();
  const Hardware hw = toy();
  PlanRequest r = one_short_sequence();
  r.devices = 1;
  r.prefill_chunk = 16;
  const PlanResult p = simulate(t, hw, r);
  EXPECT_EQ(p.prefill.steps, 4);
  EXPECT_EQ(p.prefill.step.new_tokens, 64);
  double us = 0, flops = 0;
  for (int j = 0; j < 4; ++j) {
    const PhaseResult c = cost_step(t, hw, p.layout, r.opt, Step{Phase::Prefill, 1, 16, 16 * j}, nullptr, true);
    us += c.step_us;
    for (const auto& o : c.ops) flops += o.op.flops;
  }
  EXPECT_REL(p.prefill.step_us, us);
  double got = 0;
  for (const auto& o : p.prefill.ops) got += o.op.flops;
  EXPECT_REL(got, flops);
  EXPECT_REL(p.ttft_ms, us / 1e3);
  EXPECT_REL(p.memory.workspace_bytes, activation_workspace_bytes(t, p.layout, r.opt, 1, 16, 48));
  // The whole prompt in one step: one cost_step, a workspace for 64 tokens.
  r.prefill_chunk = 0;
  const PlanResult q = simulate(t, hw, r);
  EXPECT_EQ(q.prefill.steps, 1);
  EXPECT_REL(q.prefill.step_us, cost_step(t, hw, q.layout, r.opt, Step{Phase::Prefill, 1, 64, 0}, nullptr, true).step_us);
  EXPECT_REL(q.memory.workspace_bytes, activation_workspace_bytes(t, q.layout, r.opt, 1, 64, 0));
  EXPECT_GT(q.memory.workspace_bytes, p.memory.workspace_bytes);
  r.prefill_chunk = -1;
  EXPECT_THROW(simulate(t, hw, r), dsa::Error);
}

TEST(SimPlan, DecodeBatchMustFitTheCache) {
  // Every device of a dp group caches its group's sequences at the decode depth plus the
  // step's tokens (here 100 + 1 + one MTP draft); one sequence more per group than the
  // cache holds is costed as asked but reported as not fitting.
  const SimModel t = tiny();
  const Hardware hw = toy();
  PlanRequest r;
  r.devices = 2;
  r.input_len = 64;
  r.output_len = 32;
  r.context = 100;
  r.opt.mtp = 1;
  // The activation workspace grows with the batch, so the cache shrinks with it: find the
  // largest sequences per group g that fit, by bisection over the plan itself.
  auto plan = [&](int64_t g) {
    r.batch = 2 * g;
    return simulate(t, hw, r);
  };
  int64_t lo = 1, hi = plan(1).memory.max_cached_tokens_per_device / 102 + 1;
  ASSERT_TRUE(plan(lo).decode_fits);
  ASSERT_FALSE(plan(hi).decode_fits);
  while (hi - lo > 1) (plan((lo + hi) / 2).decode_fits ? lo : hi) = (lo + hi) / 2;
  const PlanResult fit = plan(lo), over = plan(lo + 1);
  EXPECT_EQ(fit.decode_cached_tokens_per_device, lo * 102);
  EXPECT_LE(lo * 102, fit.memory.max_cached_tokens_per_device);
  EXPECT_EQ(over.decode_cached_tokens_per_device, (lo + 1) * 102);
  EXPECT_GT((lo + 1) * 102, over.memory.max_cached_tokens_per_device);
  EXPECT_GT(over.decode_tokens_per_s_per_device, 0);
  r.batch = 2 * (lo + 1);
  const PlanContext c{&t, &hw, &r};
  EXPECT_NE(format_text(c, over, {}, false).find("DOES NOT FIT the cache"), std::string::npos);
  EXPECT_EQ(format_text(c, fit, {}, false).find("DOES NOT FIT"), std::string::npos);
  const auto j = nlohmann::json::parse(format_json(c, over, {}));
  EXPECT_FALSE(j["decode_fits"].get<bool>());
  EXPECT_EQ(j["decode_cached_tokens_per_device"].get<int64_t>(), (lo + 1) * 102);
  // Pipeline stages: a device holds every micro-batch's sequences of its own layers.
  r.pp = 2;
  r.batch = 6;
  const PlanResult pp = simulate(t, hw, r);
  EXPECT_EQ(pp.layout.dp, 1);
  EXPECT_EQ(pp.decode.step.seqs, 3);
  EXPECT_EQ(pp.decode_cached_tokens_per_device, 6 * 102);
  // The automatic batch fits at the decode depth when it is deeper than input + output.
  r.pp = 1;
  r.batch = 0;
  r.context = 5000;
  const PlanResult deep = simulate(t, hw, r);
  EXPECT_TRUE(deep.batch_auto);
  EXPECT_TRUE(deep.decode_fits);
  EXPECT_EQ(deep.batch, 2 * (deep.memory.max_cached_tokens_per_device / 5002));
  // A position in the cost sweep is checked the same way, with the plan's batch.
  r.context = 100;
  const PlanResult base = plan(lo / 2);
  const int64_t last = base.memory.max_cached_tokens_per_device / (lo / 2) - 2;
  EXPECT_TRUE(cost_at_position(t, hw, r, base, last, nullptr, 16).fits);
  EXPECT_FALSE(cost_at_position(t, hw, r, base, last + 1, nullptr, 16).fits);
}

TEST(SimPlan, ServingFigures) {
  const SimModel t = tiny();
  const Hardware hw = toy();
  PlanRequest r;
  r.devices = 2;
  r.batch = 6;
  r.input_len = 64;
  r.output_len = 32;
  r.opt.mtp = 1;
  r.acceptance = 0.5;
  const PlanResult p = simulate(t, hw, r);
  EXPECT_EQ(p.layout.dp, 2);
  EXPECT_EQ(p.layout.ep, 2);
  EXPECT_EQ(p.context, 64 + 16);
  EXPECT_REL(p.tokens_per_step, 1.5);
  EXPECT_EQ(p.decode.step.seqs, 3);
  EXPECT_EQ(p.decode.step.new_tokens, 2);
  EXPECT_REL(p.tpot_ms, p.decode.step_us / 1e3 / 1.5);
  EXPECT_REL(p.decode_tokens_per_s_per_device, 6 * 1.5 / (p.decode.step_us / 1e6) / 2);
  EXPECT_REL(p.prefill_tokens_per_s_per_device, 64.0 * 2 / (p.prefill.step_us / 1e6) / 2);
  EXPECT_REL(p.ttft_ms, p.prefill.step_us / 1e3);
  // $3.6 per hour = $0.001 per second.
  EXPECT_REL(p.decode_cost_per_m, 0.001 / p.decode_tokens_per_s_per_device * 1e6);
  // Without overlap the step is every operator in turn; overlap can only make it faster.
  r.overlap = false;
  const PlanResult q = simulate(t, hw, r);
  EXPECT_EQ(q.decode.micro_batches, 1);
  EXPECT_REL(q.decode.step_us, q.decode.compute_us + q.decode.ep_comm_us + q.decode.other_comm_us);
  EXPECT_GE(q.tpot_ms, p.tpot_ms);

  PlanRequest bad = r;
  bad.devices = 3;
  bad.tp = 2;
  EXPECT_THROW(simulate(t, hw, bad), dsa::Error);
}

TEST(SimPlan, PipelineRoundsCountTheHeadOncePerPass) {
  const SimModel t = tiny();
  const Hardware hw = toy();
  PlanRequest r;
  r.devices = 2;
  r.pp = 2;
  r.input_len = 64;
  r.output_len = 32;
  r.overlap = false;
  auto edge = [](const PhaseResult& ph) {
    double us = 0;
    for (const auto& op : ph.ops)
      if (op.op.name == "embed" || op.op.name == "final_norm" || op.op.name == "lm_head") us += op.time_us;
    return us;
  };
  // One sequence: one micro-batch, its pass runs both stages' layers and the head once.
  r.batch = 1;
  const PlanResult one = simulate(t, hw, r);
  ASSERT_EQ(one.layout.pp, 2);
  const double e1 = edge(one.decode);
  ASSERT_GT(e1, 0);
  EXPECT_REL(one.tpot_ms, ((one.decode.step_us - e1) * 2 + e1) / 1e3);
  EXPECT_REL(one.decode_tokens_per_s_per_device, 1 / (one.tpot_ms / 1e3) / 2);
  EXPECT_REL(one.ttft_ms, ((one.prefill.step_us - edge(one.prefill)) * 2 + edge(one.prefill)) / 1e3);
  // Two: both stages busy, the round is two steps of the last stage (the head's).
  r.batch = 2;
  const PlanResult two = simulate(t, hw, r);
  EXPECT_REL(two.tpot_ms, two.decode.step_us * 2 / 1e3);
  EXPECT_REL(two.decode_tokens_per_s_per_device, 2 / (two.tpot_ms / 1e3) / 2);
  EXPECT_LT(one.tpot_ms, two.tpot_ms);
}

// A micro-batch's stage times, summed by operator name: the all-to-all's two directions,
// the routed experts (and their activation), and all other computation.
struct StageSums {
  double rest = 0, experts = 0, dispatch = 0, combine = 0;
};
static StageSums stage_sums(const PhaseResult& r) {
  StageSums s;
  for (const auto& t : r.ops) {
    const std::string& n = t.op.name;
    if (n == "moe.dispatch") s.dispatch += t.time_us;
    else if (n == "moe.combine") s.combine += t.time_us;
    else if (n == "moe.experts_gate_up" || n == "moe.experts_down" || n == "moe.act" || n == "moe.gather_tokens" ||
             n == "moe.sum_outputs")
      s.experts += t.time_us;
    else if (t.op.cls != OpClass::CommTP && t.op.cls != OpClass::CommPP) s.rest += t.time_us;
  }
  return s;
}
// The two-micro-batch step: [rest a | combine b] [dispatch a | rest b] [experts a | dispatch b]
// [combine a | experts b], each pair as long as its longer half.
static double two_batch_us(const PhaseResult& a, const PhaseResult& b) {
  const StageSums x = stage_sums(a), y = stage_sums(b);
  return std::max(x.rest, y.combine) + std::max(x.dispatch, y.rest) + std::max(x.experts, y.dispatch) +
         std::max(x.combine, y.experts) + a.other_comm_us + b.other_comm_us;
}

static double sum_bytes(const PhaseResult& r) {
  double b = 0;
  for (const auto& t : r.ops) b += t.op.bytes;
  return b;
}

TEST(SimPlan, TwoMicroBatchesHideTheAllToAll) {
  const SimModel t = tiny();
  Hardware hw = toy();
  hw.launch_overhead_us = 0;  // the tiny model's kernels would be all launch cost
  PlanRequest r;
  r.devices = 8;  // two toy nodes: the all-to-all crosses the slow network
  const Layout l = resolve_layout(r, hw);
  const Options o;
  // Decode, 65 sequences: micro-batches of 32 and 33, each one batch without overlap.
  const Step full{Phase::Decode, 65, 1, 100};
  const PhaseResult one = cost_step(t, hw, l, o, full, nullptr, false);
  const PhaseResult a = cost_step(t, hw, l, o, Step{Phase::Decode, 32, 1, 100}, nullptr, false);
  const PhaseResult b = cost_step(t, hw, l, o, Step{Phase::Decode, 33, 1, 100}, nullptr, false);
  ASSERT_GT(one.ep_comm_us, 0);
  EXPECT_REL(one.step_us, one.compute_us + one.ep_comm_us + one.other_comm_us);
  const double split = two_batch_us(a, b);
  // Communication hides only behind the computation paired with it: never better than the
  // longer of all computation and all communication, never worse than both in turn.
  EXPECT_GE(split, std::max(a.compute_us + b.compute_us, a.ep_comm_us + b.ep_comm_us) - 1e-9);
  EXPECT_LE(split, a.compute_us + b.compute_us + a.ep_comm_us + b.ep_comm_us + 1e-9);
  const PhaseResult ov = cost_step(t, hw, l, o, full, nullptr, true);
  EXPECT_REL(ov.step_us, std::min(one.step_us, split));
  // Across the toy's slow network the all-to-all outweighs a second pass over the weights.
  ASSERT_LT(split, one.step_us);
  EXPECT_EQ(ov.micro_batches, 2);
  // Rows sum both halves: the same FLOPs as one batch, the weights read twice.
  EXPECT_REL(ov.compute_us, a.compute_us + b.compute_us);
  EXPECT_REL(ov.ep_comm_us, a.ep_comm_us + b.ep_comm_us);
  EXPECT_REL(sum_bytes(ov), sum_bytes(a) + sum_bytes(b));
  EXPECT_GT(sum_bytes(ov), sum_bytes(one));
  // A lone prompt splits into two chunks, the second attending to the first.
  const Step prompt{Phase::Prefill, 1, 64, 0};
  const PhaseResult p1 = cost_step(t, hw, l, o, prompt, nullptr, false);
  const PhaseResult c1 = cost_step(t, hw, l, o, Step{Phase::Prefill, 1, 32, 0}, nullptr, false);
  const PhaseResult c2 = cost_step(t, hw, l, o, Step{Phase::Prefill, 1, 32, 32}, nullptr, false);
  const double chunks = two_batch_us(c1, c2);
  EXPECT_REL(cost_step(t, hw, l, o, prompt, nullptr, true).step_us, std::min(p1.step_us, chunks));
  // One decode sequence cannot be split: overlap changes nothing.
  const Step lone{Phase::Decode, 1, 1, 100};
  EXPECT_REL(cost_step(t, hw, l, o, lone, nullptr, true).step_us, cost_step(t, hw, l, o, lone, nullptr, false).step_us);
  // Replicated attention has no all-to-all to hide, only its all-reduce: one batch.
  PlanRequest rep = r;
  rep.replicated_attention = true;
  const Layout lr = resolve_layout(rep, hw);
  EXPECT_EQ(lr.dp, 1);
  EXPECT_EQ(lr.rep, 8);
  EXPECT_EQ(lr.ep, 8);
  const PhaseResult rr = cost_step(t, hw, lr, o, full, nullptr, true);
  ASSERT_GT(rr.ep_comm_us, 0);
  EXPECT_EQ(rr.micro_batches, 1);
  EXPECT_REL(rr.step_us, rr.compute_us + rr.ep_comm_us + rr.other_comm_us);
  rep.dp = 2;
  EXPECT_THROW(resolve_layout(rep, hw), dsa::Error);
  // With no all-to-all (one device) there is nothing to hide and the step stays one batch.
  PlanRequest solo;
  solo.devices = 1;
  const Layout l1 = resolve_layout(solo, hw);
  const PhaseResult s1 = cost_step(t, hw, l1, o, full, nullptr, true);
  EXPECT_EQ(s1.ep_comm_us, 0);
  EXPECT_EQ(s1.micro_batches, 1);
  EXPECT_REL(s1.step_us, s1.compute_us + s1.other_comm_us);
  // A network fast enough that a second pass over the weights costs more than the hidden
  // all-to-all: one batch is the faster schedule and is taken.
  Hardware fast = hw;
  fast.inter_node_bandwidth_gbps = fast.intra_node_bandwidth_gbps = 1e6;
  fast.inter_node_latency_us = fast.intra_node_latency_us = 0;
  const PhaseResult f = cost_step(t, fast, l, o, Step{Phase::Decode, 64, 1, 100}, nullptr, true);
  EXPECT_EQ(f.micro_batches, 1);
  EXPECT_REL(f.step_us, f.compute_us + f.ep_comm_us + f.other_comm_us);
  // This engine runs a step as one batch, whatever its exchange costs.
  Hardware eng = hw;
  eng.engine_collectives = true;
  const PhaseResult e = cost_step(t, eng, l, o, full, nullptr, true);
  ASSERT_GT(e.ep_comm_us, 0);
  EXPECT_EQ(e.micro_batches, 1);
  EXPECT_REL(e.step_us, e.compute_us + e.ep_comm_us + e.other_comm_us);
}

TEST(SimPlan, SparseDecodeCostIsFlatAndDenseGrowsWithContext) {
  // DeepSeek's decode deployment shape: 128 H800s, EP128, 128 sequences per device.
  const Hardware h800 = load_hardware("h800");
  PlanRequest r;
  r.devices = 128;
  r.batch = 128 * 128;
  r.input_len = 1024;
  r.output_len = 1024;
  const SimModel v32 = load_model("deepseek-v3.2"), v3 = load_model("deepseek-v3");
  const PlanResult b32 = simulate(v32, h800, r), b3 = simulate(v3, h800, r);
  const auto s32 = [&](int64_t pos) { return cost_at_position(v32, h800, r, b32, pos).decode_cost_per_m; };
  const auto s3 = [&](int64_t pos) { return cost_at_position(v3, h800, r, b3, pos).decode_cost_per_m; };
  EXPECT_GT(s3(131072) / s3(8192), 5.0);                         // dense attention grows with the position
  EXPECT_LT(s32(131072) / s32(8192), 0.5 * s3(131072) / s3(8192));  // the indexer grows far slower
  EXPECT_GT(s3(131072) / s32(131072), 3.0);
}

TEST(SimSearch, DeviceCounts) {
  // Powers of two inside a node, then whole nodes in powers of two; one node at most when
  // the profile has no link between nodes.
  Hardware hw = toy();
  hw.devices_per_node = 72;
  EXPECT_EQ(search_device_counts(hw, 256), (std::vector<int>{1, 2, 4, 8, 16, 32, 64, 72, 144}));
  hw.devices_per_node = 8;
  EXPECT_EQ(search_device_counts(hw, 40), (std::vector<int>{1, 2, 4, 8, 16, 32}));
  hw.inter_node_bandwidth_gbps = 0;
  EXPECT_EQ(search_device_counts(hw, 40), (std::vector<int>{1, 2, 4, 8}));
}

TEST(SimSearch, CandidatesArePlansThatMeetTheTargets) {
  const SimModel t = tiny();
  const Hardware hw = toy();  // 4 devices per node
  SearchRequest s;
  s.base.input_len = 64;
  s.base.output_len = 32;
  s.devices = 4;
  // Four devices: tp 1 (pp 1, 2, 4 -> the tiny model's 3 layers allow 1 and 2), tp 2 (pp 1,
  // 2), tp 4 (pp 1): five layouts.
  const SearchResult all = search_layouts(t, hw, s);
  EXPECT_EQ(all.layouts, 5);
  ASSERT_GE(all.candidates.size(), 3u);
  // A TPOT target between the candidates' own TPOTs, and a TTFT target all meet.
  std::vector<double> tpots;
  double ttft = 0;
  for (const auto& k : all.candidates) {
    tpots.push_back(k.plan.tpot_ms);
    ttft = std::max(ttft, k.plan.ttft_ms);
  }
  std::sort(tpots.begin(), tpots.end());
  s.max_tpot_ms = tpots[tpots.size() / 2];
  s.max_ttft_ms = ttft;
  s.devices = 0;
  s.max_devices = 16;
  const SearchResult r = search_layouts(t, hw, s);
  EXPECT_EQ(r.layouts, 1 + 3 + 5 + 6 + 6);  // counts 1, 2, 4, 8, 16 (by hand as above)
  ASSERT_FALSE(r.candidates.empty());
  for (size_t i = 0; i < r.candidates.size(); ++i) {
    const Candidate& k = r.candidates[i];
    // The row is the plan of its own options, and it meets the targets and fits.
    const PlanResult p = simulate(t, hw, k.req);
    EXPECT_REL(k.plan.tpot_ms, p.tpot_ms);
    EXPECT_REL(k.plan.e2e_output_tokens_per_s_per_device, p.e2e_output_tokens_per_s_per_device);
    EXPECT_LE(p.tpot_ms, s.max_tpot_ms);
    EXPECT_LE(p.ttft_ms, s.max_ttft_ms);
    EXPECT_TRUE(p.memory.fits && p.decode_fits);
    EXPECT_REL(k.cost_per_million_output, 0.001 / p.e2e_output_tokens_per_s_per_device * 1e6);
    if (i > 0) {
      EXPECT_GE(r.candidates[i - 1].plan.e2e_output_tokens_per_s_per_device, p.e2e_output_tokens_per_s_per_device);
    }
    // The batch is the largest that meets the target: one more sequence per dp group and
    // micro-batch misses it or does not fit (a TPOT target lifts the 128-per-device ceiling).
    PlanRequest more = k.req;
    more.batch += int64_t(k.req.dp) * k.req.pp;
    const PlanResult q = simulate(t, hw, more);
    EXPECT_TRUE(q.tpot_ms > s.max_tpot_ms || !q.decode_fits) << i;
  }
  // Prefill and decode pools: each the best layout for its phase within its own target.
  ASSERT_TRUE(r.has_disaggregated);
  const Disaggregated& d = r.disaggregated;
  EXPECT_LE(d.prefill.plan.ttft_ms, s.max_ttft_ms);
  EXPECT_LE(d.decode.plan.tpot_ms, s.max_tpot_ms);
  for (const Candidate& k : r.candidates) {
    EXPECT_GE(d.prefill.plan.prefill_tokens_per_s_per_device, k.plan.prefill_tokens_per_s_per_device);
    EXPECT_GE(d.decode.plan.decode_tokens_per_s_per_device, k.plan.decode_tokens_per_s_per_device);
  }
  EXPECT_REL(d.prefill_device_s, 64 / d.prefill.plan.prefill_tokens_per_s_per_device);
  EXPECT_REL(d.decode_device_s, 32 / d.decode.plan.decode_tokens_per_s_per_device);
  EXPECT_REL(d.output_tokens_per_s_per_device, 32 / (d.prefill_device_s + d.decode_device_s));
  EXPECT_REL(d.prefill_share, d.prefill_device_s / (d.prefill_device_s + d.decode_device_s));
  // A shared layout is the case where both pools are the same layout, so separate pools
  // serve at least as many output tokens per device (the plan's shared figure is
  // output / (input / prefill rate + output / decode rate) of one layout).
  const Candidate& one = r.candidates[0];
  EXPECT_REL(one.plan.e2e_output_tokens_per_s_per_device,
             32 / (64 / one.plan.prefill_tokens_per_s_per_device + 32 / one.plan.decode_tokens_per_s_per_device));
  EXPECT_GE(d.output_tokens_per_s_per_device, one.plan.e2e_output_tokens_per_s_per_device * (1 - 1e-12));
  // The search ranks what it found: the target removed some of the unconstrained candidates.
  s.max_tpot_ms = 0;
  s.max_ttft_ms = 0;
  EXPECT_LE(r.candidates.size(), search_layouts(t, hw, s).candidates.size());
  // Nothing meets an impossible target, and the report says which constraint failed.
  s.max_tpot_ms = 1e-9;
  const SearchResult none = search_layouts(t, hw, s);
  EXPECT_TRUE(none.candidates.empty());
  EXPECT_GT(none.fitting, 0);
  PlanRequest base = s.base;
  const PlanContext c{&t, &hw, &base};
  EXPECT_NE(format_search_text(c, {hw}, s, none, 10).find("No layout meets the targets"), std::string::npos);
  const auto j = nlohmann::json::parse(format_search_json(c, {hw}, s, r, 2));
  EXPECT_EQ(j["layouts_tried"].get<int>(), r.layouts);
  ASSERT_EQ(j["candidates"].size(), std::min<size_t>(2, r.candidates.size()));
  EXPECT_EQ(j["candidates"][0]["batch"].get<int64_t>(), r.candidates[0].plan.batch);
  EXPECT_EQ(j["disaggregated"]["decode"]["batch"].get<int64_t>(), d.decode.plan.batch);
  // The full DeepSeek-V3.2 fits no toy device: the report says so.
  const SimModel big = load_model("deepseek-v3.2");
  s.max_tpot_ms = 0;
  s.max_devices = 2;
  const SearchResult nofit = search_layouts(big, hw, s);
  EXPECT_EQ(nofit.fitting, 0);
  EXPECT_NE(format_search_text(PlanContext{&big, &hw, &base}, {hw}, s, nofit, 10).find("No layout holds the weights"),
            std::string::npos);
}

TEST(SimSearch, SeveralProfilesRankByCost) {
  // The same device at twice the price: every layout serves the same tokens at twice the
  // cost, so each of its rows ranks after its twin, and the pools come from the cheaper one.
  const SimModel t = tiny();
  const Hardware a = toy();
  Hardware b = toy();
  b.name = "toy2x";
  b.price_per_hour = 2 * a.price_per_hour;
  SearchRequest s;
  s.base.input_len = 64;
  s.base.output_len = 32;
  s.max_devices = 8;
  const SearchResult one = search_layouts(t, a, s);
  const SearchResult both = search_hardware(t, {a, b}, s);
  EXPECT_EQ(both.layouts, 2 * one.layouts);
  ASSERT_EQ(both.candidates.size(), 2 * one.candidates.size());
  EXPECT_EQ(both.candidates[0].hardware, "toy");
  for (size_t i = 1; i < both.candidates.size(); ++i)
    EXPECT_LE(both.candidates[i - 1].cost_per_million_output, both.candidates[i].cost_per_million_output);
  double cheap = 0, dear = 0;
  for (const Candidate& k : both.candidates) (k.hardware == "toy" ? cheap : dear) += k.cost_per_million_output;
  EXPECT_REL(dear, 2 * cheap);
  ASSERT_TRUE(both.has_disaggregated);
  EXPECT_EQ(both.disaggregated.decode.hardware, "toy");
  // One price for all (--price): the twins cost the same.
  s.base.price_per_hour = 1;
  const SearchResult same = search_hardware(t, {a, b}, s);
  EXPECT_REL(same.candidates[0].cost_per_million_output, same.candidates[1].cost_per_million_output);
  PlanRequest base = s.base;
  const PlanContext c{&t, &a, &base};
  const std::string text = format_search_text(c, {a, b}, s, both, 3);
  EXPECT_NE(text.find("the best of each other profile"), std::string::npos) << text;
  EXPECT_NE(text.find("--hardware toy "), std::string::npos) << text;
  const auto j = nlohmann::json::parse(format_search_json(c, {a, b}, s, both, 100));
  EXPECT_EQ(j["hardware"].size(), 2u);
  EXPECT_EQ(j["candidates"].size(), both.candidates.size());
}

TEST(SimReport, JsonContract) {
  const SimModel m = load_model("v32-mini");
  const Hardware hw = load_hardware("h100");
  PlanRequest r;
  r.batch = 1;
  r.context = 4096;
  r.input_len = 512;
  const PlanResult p = simulate(m, hw, r);
  const PlanContext c{&m, &hw, &r};
  const auto j = nlohmann::json::parse(format_json(c, p, {}));
  for (const char* k : {"prefill_tokens_per_s_per_device", "decode_tokens_per_s_per_device", "ttft_ms", "tpot_ms",
                        "cache_bytes_per_token", "max_cached_tokens_per_device"})
    EXPECT_TRUE(j.contains(k) && j[k].is_number()) << k;
  ASSERT_TRUE(j["ops"].is_array());
  bool saw_prefill = false, saw_decode = false;
  for (const auto& op : j["ops"]) {
    for (const char* k : {"name", "phase", "flops", "bytes", "time_us", "bound"}) EXPECT_TRUE(op.contains(k)) << k;
    saw_prefill |= op["phase"] == "prefill";
    saw_decode |= op["phase"] == "decode";
  }
  EXPECT_TRUE(saw_prefill && saw_decode);
  // Which schedule each phase ran: one batch or two micro-batches.
  EXPECT_EQ(j["prefill_micro_batches"].get<int>(), p.prefill.micro_batches);
  EXPECT_EQ(j["decode_micro_batches"].get<int>(), p.decode.micro_batches);
  EXPECT_EQ(j["cache_bytes_per_token"].get<double>(), 8 * (656 + 132));
  EXPECT_NE(format_text(c, p, {}, true).find("attn.core"), std::string::npos);
  const std::string svg = svg_line_plot("t", "x", "y", {{"a", {{1, 1}, {2, 3}}, false}}, false);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("polyline"), std::string::npos);
}

static std::vector<std::string> x_labels(const std::string& svg) {
  // Axis labels under the plot: the text elements anchored in the middle, title and axis
  // names left out (they are longer than any tick).
  std::vector<std::string> v;
  for (size_t at = svg.find("text-anchor=\"middle\">"); at != std::string::npos;
       at = svg.find("text-anchor=\"middle\">", at + 1)) {
    const size_t b = svg.find('>', at) + 1, e = svg.find('<', b);
    const std::string t = svg.substr(b, e - b);
    if (t.size() <= 5) v.push_back(t);
  }
  return v;
}

TEST(SimPlot, PositionTicksAreRound) {
  // Token positions from 1K to 128K read 1K, 16K, 32K, ... 128K, not eighths of the range.
  const std::vector<std::string> pos = x_labels(svg_line_plot("title", "token position", "y", {{"a", {{1024, 1}, {131072, 2}}, false}}, false));
  const std::vector<std::string> want_pos = {"1K", "16K", "32K", "48K", "64K", "80K", "96K", "112K", "128K"};
  EXPECT_EQ(pos, want_pos);
  // A small range steps by 1, 2 or 5 x 10^k from its first round value.
  const std::vector<std::string> small = x_labels(svg_line_plot("title", "token position", "y", {{"a", {{0, 1}, {10, 2}}, false}}, false));
  const std::vector<std::string> want_small = {"0", "2", "4", "6", "8", "10"};
  EXPECT_EQ(small, want_small);
}

TEST(SimCli, PlanJsonContract) {
  const std::string cmd = std::string(DSA_BINARY) +
                          " plan --model v32-mini --hardware h100 --batch 1 --context 16384 --input-len 512 --json";
  FILE* f = popen(cmd.c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  ASSERT_EQ(pclose(f), 0) << out;
  const auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["context"], 16384);
  EXPECT_GT(j["decode_tokens_per_s_per_device"].get<double>(), 0);
  FILE* g = popen((std::string(DSA_BINARY) + " plan --model nope 2>&1").c_str(), "r");
  ASSERT_NE(g, nullptr);
  out.clear();
  while ((n = fread(buf, 1, sizeof buf, g)) > 0) out.append(buf, n);
  EXPECT_NE(pclose(g), 0);
  EXPECT_NE(out.find("unknown model"), std::string::npos) << out;
}

// Runs `dsa ARGS`, stdout and stderr into out; returns pclose's status.
static int run_dsa(const std::string& args, std::string& out) {
  FILE* f = popen((std::string(DSA_BINARY) + " " + args + " 2>&1").c_str(), "r");
  if (!f) return -1;
  out.clear();
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  return pclose(f);
}

// `--search --json` through the binary: the first candidate's printed options, given back to
// `dsa plan`, reproduce its figures.
TEST(SimCli, SearchOptionsReproduceThePlan) {
  std::string out;
  const std::string workload = "plan --model v32-mini --hardware h100 --input-len 2048 --output-len 256";
  ASSERT_EQ(run_dsa(workload + " --search --max-devices 16 --max-tpot 20 --top 2 --json", out), 0) << out;
  const auto j = nlohmann::json::parse(out);
  ASSERT_GE(j["candidates"].size(), 1u);
  EXPECT_LE(j["candidates"].size(), 2u);
  const auto& best = j["candidates"][0];
  EXPECT_LE(best["tpot_ms"].get<double>(), 20.0);
  ASSERT_TRUE(j.contains("disaggregated"));
  ASSERT_EQ(run_dsa(workload + " " + best["plan_options"].get<std::string>() + " --json", out), 0) << out;
  const auto p = nlohmann::json::parse(out);
  EXPECT_DOUBLE_EQ(p["tpot_ms"].get<double>(), best["tpot_ms"].get<double>());
  EXPECT_DOUBLE_EQ(p["e2e_output_tokens_per_s_per_device"].get<double>(),
                   best["e2e_output_tokens_per_s_per_device"].get<double>());
  EXPECT_TRUE(p["decode_fits"].get<bool>());
}

// Weights are costed in the dtype the checkpoint stores unless --weight-dtype says otherwise:
// a bf16 checkpoint (no quantization_config) is not planned as fp8.
TEST(SimCli, WeightDtypeDefaultsToTheCheckpoints) {
  const std::filesystem::path dir = dsa::test::scratch("plan_bf16");
  std::filesystem::create_directories(dir);
  {
    std::ofstream(dir / "config.json") << dsa::sim::test::kTinyJson;
  }
  std::string out;
  const std::string plan = "plan --model " + dir.string() + " --hardware h100 --batch 1 --input-len 64 --json";
  ASSERT_EQ(run_dsa(plan, out), 0) << out;
  const auto bf = nlohmann::json::parse(out);
  EXPECT_EQ(bf["weight_dtype"], "bf16");
  ASSERT_EQ(run_dsa(plan + " --weight-dtype fp8", out), 0) << out;
  const auto f8 = nlohmann::json::parse(out);
  EXPECT_EQ(f8["weight_dtype"], "fp8");
  EXPECT_GT(bf["memory"]["weight_bytes"].get<double>(), f8["memory"]["weight_bytes"].get<double>());
  ASSERT_EQ(run_dsa("plan --model deepseek-v3.2 --hardware h100 --batch 1 --json", out), 0) << out;
  EXPECT_EQ(nlohmann::json::parse(out)["weight_dtype"], "fp8");  // the released fp8 checkpoint
  std::filesystem::remove_all(dir);
}

// --numa is a global option, accepted before or after the command name; a bad mode is one
// clear error naming the accepted ones.
TEST(SimCli, NumaOptionBeforeOrAfterTheCommand) {
  std::string out;
  const std::string plan = "plan --model v32-mini --hardware h100 --batch 1 --input-len 512 --json";
  EXPECT_EQ(run_dsa("--numa off " + plan, out), 0) << out;
  EXPECT_GT(nlohmann::json::parse(out)["decode_tokens_per_s_per_device"].get<double>(), 0);
  EXPECT_EQ(run_dsa(plan + " --numa interleave", out), 0) << out;
  EXPECT_GT(nlohmann::json::parse(out)["decode_tokens_per_s_per_device"].get<double>(), 0);
  EXPECT_NE(run_dsa(plan + " --numa sideways", out), 0);
  EXPECT_NE(out.find("--numa: unknown mode 'sideways' (expected auto, off or interleave)"), std::string::npos) << out;
}

// Invalid options are refused with the option named, never replaced by a default.
TEST(SimCli, InvalidOptionsAreNamed) {
  std::string out;
  for (const auto& [args, needle] : std::vector<std::pair<std::string, std::string>>{
           {"plan --devices 0", "--devices"},
           {"plan --tp -1", "--tp"},
           {"plan --batch 0", "--batch"},
           {"plan --context -1", "--context"},
           {"plan --mtp 1 --acceptance nan", "--acceptance"},
           {"plan --price -1", "--price"},
           {"plan --sweep-batch 8,-3", "--sweep-batch"},
           {"plan --kernel-table /", "--kernel-table"},
           {"plan --pp 100", "--pp 100"},
           {"plan --devices 72", "--redundant-experts 32"},
           {"plan --redundant-experts -1", "--redundant-experts"},
           {"plan --prefill-chunk -8", "--prefill-chunk"},
           {"plan --model deepseek-v3.2 --input-len 200000", "max_position_embeddings (163840)"},
           {"plan --context 163840", "--context 163840"},
           {"plan --sweep-context 4096,170000", "position 170000"},
           {"plan --input-len 99999999999999", "--input-len"},
           {"bench --model . -t 100000", "--threads"},
           {"bench --model . -t 0", "--threads"},
           {"bench --model . -p 2147483647", "--prompt"},
           {"plan --search --tp 2", "--tp"},
           {"plan --search --batch 64", "--batch"},
           {"plan --max-tpot 50", "--search"},
           {"plan --search --max-devices 0", "--max-devices"},
           {"plan --search --max-ttft -1", "--max-ttft"},
           {"plan --hardware h200,b200", "--search"},
           {"plan --search --hardware h200,,b200", "empty name"},
           {"plan --search --hardware h200,nope", "nope"},
           {"benhc --model .", "unknown command 'benhc'"}}) {
    EXPECT_NE(run_dsa(args, out), 0) << args;
    EXPECT_NE(out.find(needle), std::string::npos) << args << ": " << out;
  }
}

// `--comm FILE`: bench comm's points, made here from a chosen latency and bandwidth with the
// ring all-reduce's hops and bytes, come back as those link figures, on the link the node
// count says; a file that is not bench comm's JSON is refused, naming it.
TEST(SimCli, CommMeasurementsSetTheLinks) {
  for (const int nodes : {1, 4}) {
    SCOPED_TRACE(nodes);
    const int ranks = 8;
    const double lat_us = 7.5, gbps = 40;
    nlohmann::json j = {{"collective", "allreduce"}, {"ranks", ranks}, {"nodes", nodes}, {"hidden", 7168}};
    for (double tokens : {1.0, 16.0, 512.0}) {
      const double bytes = tokens * 7168 * 4, moved = 2.0 * (ranks - 1) / ranks * bytes;
      j["points"].push_back({{"bytes", bytes}, {"median_us", 2.0 * (ranks - 1) * lat_us + moved / (gbps * 1e3)}});
    }
    const std::string file = dsa::test::scratch("comm_" + std::to_string(nodes) + ".json");
    std::ofstream(file) << j.dump();
    std::string out;
    ASSERT_EQ(run_dsa("plan --hardware h200 --comm " + file + " --show-hardware", out), 0) << out;
    const auto hw = nlohmann::json::parse(out.substr(out.find('{')));
    const std::string link = nodes > 1 ? "inter_node" : "intra_node";
    EXPECT_NEAR(hw[link + "_latency_us"].get<double>(), lat_us, 1e-6);
    EXPECT_NEAR(hw[link + "_bandwidth_gbps"].get<double>(), gbps, 1e-6);
    EXPECT_EQ(hw["efficiency"]["comm"].get<double>(), 1.0);
  }
  const std::string bad = dsa::test::scratch("comm_bad.json");
  std::ofstream(bad) << R"({"collective": "allreduce", "ranks": 2, "nodes": 1, "points": [{"bytes": 4, "median_us": 1}]})";
  std::string out;
  EXPECT_NE(run_dsa("plan --comm " + bad, out), 0);
  EXPECT_NE(out.find("at least two sizes"), std::string::npos) << out;
  std::ofstream(bad) << "[1, 2]";
  EXPECT_NE(run_dsa("plan --comm " + bad, out), 0);
  EXPECT_NE(out.find("dsa bench comm --json"), std::string::npos) << out;
}
