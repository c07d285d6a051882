#include "sim/hardware.h"

#include <omp.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/mmap_file.h"
#include "io/json.h"
#include "sim/probe.h"

using nlohmann::json;

namespace dsa::sim {
namespace {

// Dense (non-sparse) vendor peaks. Interconnect bandwidth is per device and per direction:
// NVLink 4 = 900 GB/s bidirectional -> 450; H800's NVLink is cut to 400 -> 200; NVLink 5 =
// 1.8 TB/s -> 900. Scale-out is one 400 Gb/s NIC per device -> 50 GB/s (200 Gb/s -> 25).
// Latencies: about 2 us per NVLink-class hop and 5 us per RDMA hop, including software.
// Prices are rental assumptions ($/device-hour); DeepSeek itself assumed $2 for H800.
// Efficiency blocks are omitted where the defaults in hardware.h apply (see docs/PLAN.md).
// H20 keeps its kernels' full rates (`sustained` 1): the one serving figure published for it
// runs faster than they predict, where the full-compute GPUs run at about half of theirs.
struct Builtin {
  const char* name;
  const char* json;
};

const Builtin kBuiltins[] = {
    {"h800", R"J({"name": "h800", "description": "NVIDIA H800 SXM5 80 GB (China-market H100, NVLink cut to 400 GB/s)",
      "bf16_tflops": 989.5, "fp8_tflops": 1979, "memory_bandwidth_gbps": 3350, "memory_gib": 79.6,
      "devices_per_node": 8, "intra_node_bandwidth_gbps": 200, "intra_node_latency_us": 2,
      "inter_node_bandwidth_gbps": 50, "inter_node_latency_us": 5, "launch_overhead_us": 3, "price_per_hour": 2.0,
      "sources": "NVIDIA H100 SXM datasheet (compute, HBM3); H800 NVLink 400 GB/s; 8x400G CX7 per node as in DeepSeek's cluster"})J"},
    {"h100", R"J({"name": "h100", "description": "NVIDIA H100 SXM5 80 GB",
      "bf16_tflops": 989.5, "fp8_tflops": 1979, "memory_bandwidth_gbps": 3350, "memory_gib": 79.6,
      "devices_per_node": 8, "intra_node_bandwidth_gbps": 450, "intra_node_latency_us": 2,
      "inter_node_bandwidth_gbps": 50, "inter_node_latency_us": 5, "launch_overhead_us": 3, "price_per_hour": 2.5,
      "sources": "NVIDIA H100 SXM datasheet"})J"},
    {"h200", R"J({"name": "h200", "description": "NVIDIA H200 SXM 141 GB",
      "bf16_tflops": 989.5, "fp8_tflops": 1979, "memory_bandwidth_gbps": 4800, "memory_gib": 140.4,
      "devices_per_node": 8, "intra_node_bandwidth_gbps": 450, "intra_node_latency_us": 2,
      "inter_node_bandwidth_gbps": 50, "inter_node_latency_us": 5, "launch_overhead_us": 3, "price_per_hour": 3.0,
      "sources": "NVIDIA H200 datasheet (same GH100 compute as H100, HBM3e 4.8 TB/s)"})J"},
    {"h20", R"J({"name": "h20", "description": "NVIDIA H20 96 GB (China-market Hopper, cut compute)",
      "bf16_tflops": 148, "fp8_tflops": 296, "memory_bandwidth_gbps": 4000, "memory_gib": 95.6,
      "devices_per_node": 8, "intra_node_bandwidth_gbps": 450, "intra_node_latency_us": 2,
      "inter_node_bandwidth_gbps": 50, "inter_node_latency_us": 5, "launch_overhead_us": 3, "price_per_hour": 1.0,
      "efficiency": {"sustained": 1},
      "sources": "NVIDIA H20 product brief (148 TFLOPS bf16, 296 fp8, 4.0 TB/s, NVLink 900 GB/s); sustained 1: Ant Group's SGLang prefill on 8 H20s runs faster than these kernel rates predict, where every full-compute GPU runs at about half of them"})J"},
    {"b200", R"J({"name": "b200", "description": "NVIDIA B200 (HGX/DGX B200, 180 GB)",
      "bf16_tflops": 2250, "fp8_tflops": 4500, "fp4_tflops": 9000, "memory_bandwidth_gbps": 8000, "memory_gib": 179.1,
      "devices_per_node": 8, "intra_node_bandwidth_gbps": 900, "intra_node_latency_us": 2,
      "inter_node_bandwidth_gbps": 50, "inter_node_latency_us": 5, "launch_overhead_us": 3, "price_per_hour": 4.5,
      "sources": "NVIDIA DGX B200 datasheet (72 PF fp8 / 144 PF fp4 sparse per 8 GPUs, halved for dense; 64 TB/s HBM3e)"})J"},
    {"gb200", R"J({"name": "gb200", "description": "NVIDIA GB200 NVL72 (one Blackwell GPU, 72-GPU NVLink domain)",
      "bf16_tflops": 2500, "fp8_tflops": 5000, "fp4_tflops": 10000, "memory_bandwidth_gbps": 8000, "memory_gib": 184.0,
      "devices_per_node": 72, "intra_node_bandwidth_gbps": 900, "intra_node_latency_us": 3,
      "inter_node_bandwidth_gbps": 50, "inter_node_latency_us": 5, "launch_overhead_us": 3, "price_per_hour": 6.0,
      "sources": "NVIDIA GB200 NVL72 spec (180 PF fp8 / 360 PF fp4 sparse per 72 GPUs, halved for dense; 13.4 TB HBM3e)"})J"},
    {"mi300x", R"J({"name": "mi300x", "description": "AMD Instinct MI300X 192 GB",
      "bf16_tflops": 1307, "fp8_tflops": 2615, "memory_bandwidth_gbps": 5300, "memory_gib": 192,
      "devices_per_node": 8, "intra_node_bandwidth_gbps": 448, "intra_node_latency_us": 3,
      "inter_node_bandwidth_gbps": 50, "inter_node_latency_us": 5, "launch_overhead_us": 4, "price_per_hour": 2.0,
      "sources": "AMD MI300X datasheet (dense bf16/fp8, 5.3 TB/s, 7 Infinity Fabric links x 64 GB/s)"})J"},
    {"ascend-910b", R"J({"name": "ascend-910b", "description": "Huawei Ascend 910B 64 GB (no fp8 units: fp8 runs as W8A8 int8)",
      "bf16_tflops": 313, "fp8_tflops": 626, "memory_bandwidth_gbps": 1600, "memory_gib": 64,
      "devices_per_node": 8, "intra_node_bandwidth_gbps": 196, "intra_node_latency_us": 3,
      "inter_node_bandwidth_gbps": 25, "inter_node_latency_us": 6, "launch_overhead_us": 5, "price_per_hour": 1.0,
      "sources": "public 910B spec sheets (fp16 313 TFLOPS, int8 626 TOPS, HBM2e 1.6 TB/s, HCCS 392 GB/s, 200G RoCE); UNCONFIRMED by vendor datasheet"})J"},
    {"ascend-910c", R"J({"name": "ascend-910c", "description": "Huawei Ascend 910C 128 GB (two 910B-class dies, CloudMatrix384 domain)",
      "bf16_tflops": 752, "fp8_tflops": 1504, "memory_bandwidth_gbps": 3200, "memory_gib": 128,
      "devices_per_node": 384, "intra_node_bandwidth_gbps": 196, "intra_node_latency_us": 4,
      "inter_node_bandwidth_gbps": 50, "inter_node_latency_us": 6, "launch_overhead_us": 5, "price_per_hour": 2.0,
      "sources": "public CloudMatrix384 descriptions (about 2x 910B compute, 3.2 TB/s, UB network); UNCONFIRMED by vendor datasheet"})J"},
};

// Profile names compare case-insensitively and ignore separators: "Ascend 910B" = ascend-910b.
std::string lower(const std::string& s) {
  std::string k;
  for (char c : s)
    if (std::isalnum(static_cast<unsigned char>(c))) k += char(std::tolower(static_cast<unsigned char>(c)));
  return k;
}

double num(const json& j, const char* k, double def, const std::string& where) {
  if (!j.contains(k) || j[k].is_null()) return def;
  if (!j[k].is_number()) throw Error(where + ": field '" + std::string(k) + "': expected a number, got " + j[k].dump());
  const double v = j[k].get<double>();
  // Every figure of a profile is a rate, a size, a latency or a price: finite and >= 0.
  if (!(v >= 0) || !std::isfinite(v) || v > 1e15)
    throw Error(where + ": field '" + std::string(k) + "': must be a finite number >= 0, got " + j[k].dump());
  return v;
}

bool flag(const json& j, const char* k, const std::string& where) {
  if (!j.contains(k) || j[k].is_null()) return false;
  if (!j[k].is_boolean()) throw Error(where + ": field '" + std::string(k) + "': expected true or false, got " + j[k].dump());
  return j[k].get<bool>();
}

std::string str(const json& j, const char* k, const std::string& def, const std::string& where) {
  if (!j.contains(k) || j[k].is_null()) return def;
  if (!j[k].is_string()) throw Error(where + ": field '" + std::string(k) + "': expected a string, got " + j[k].dump());
  return j[k].get<std::string>();
}

// A misspelt key would otherwise leave its default in place without a word; a warning,
// not an error, so that profiles may carry notes of their own.
void known_keys(const json& j, std::initializer_list<const char*> keys, const std::string& where) {
  for (const auto& [k, v] : j.items()) {
    bool ok = false;
    for (const char* x : keys) ok = ok || k == x;
    if (!ok) {
      std::string list;
      for (const char* x : keys) list += (list.empty() ? "" : ", ") + std::string(x);
      std::fprintf(stderr, "warning: %s: unknown field '%s' is ignored (known: %s)\n", where.c_str(), k.c_str(), list.c_str());
    }
  }
}

}  // namespace

double Hardware::peak_flops(int bits) const {
  double t = bf16_tflops;
  if (bits <= 8 && fp8_tflops > 0) t = fp8_tflops;
  if (bits <= 4 && fp4_tflops > 0) t = fp4_tflops;
  return t * 1e12;
}

std::vector<std::string> builtin_hardware_names() {
  std::vector<std::string> v;
  for (const auto& b : kBuiltins) v.push_back(b.name);
  v.push_back("local");
  return v;
}

std::string builtin_hardware_json(const std::string& name) {
  const std::string n = lower(name);
  for (const auto& b : kBuiltins)
    if (n == lower(b.name)) return b.json;
  std::string list;
  for (const auto& x : builtin_hardware_names()) list += (list.empty() ? "" : ", ") + x;
  throw Error("unknown hardware '" + name + "' (built-in profiles: " + list + "; or give a profile JSON file)");
}

Hardware hardware_from_json_text(const std::string& text, const std::string& where) {
  const json j = parse_json_object(text, where);
  known_keys(j, {"name", "description", "sources", "bf16_tflops", "fp8_tflops", "fp4_tflops", "memory_bandwidth_gbps", "memory_gib",
                 "devices_per_node", "intra_node_bandwidth_gbps", "intra_node_latency_us", "inter_node_bandwidth_gbps",
                 "inter_node_latency_us", "launch_overhead_us", "dequant_flops_per_weight", "pack_flops_per_weight",
                 "decode_gemv_efficiency", "decode_gemv_flops_per_weight", "decode_gemv_bf16_efficiency",
                 "decode_gemv_bf16_flops_per_weight", "decode_gemv_bend_tokens", "decode_gemv_many_efficiency",
                 "decode_gemv_bf16_many_efficiency", "prefill_absorbed", "engine_collectives",
                 "memory_usable_fraction", "memory_reserve_gib", "price_per_hour", "efficiency"},
             where);
  Hardware h;
  h.name = str(j, "name", where, where);
  h.description = str(j, "description", "", where);
  h.sources = str(j, "sources", "", where);
  h.bf16_tflops = num(j, "bf16_tflops", 0, where);
  h.fp8_tflops = num(j, "fp8_tflops", 0, where);
  h.fp4_tflops = num(j, "fp4_tflops", 0, where);
  h.memory_bandwidth_gbps = num(j, "memory_bandwidth_gbps", 0, where);
  h.memory_gib = num(j, "memory_gib", 0, where);
  const double dpn = num(j, "devices_per_node", 8, where);
  if (dpn != std::floor(dpn) || dpn < 1 || dpn > 1024)
    throw Error(where + ": field 'devices_per_node': must be a whole number in [1, 1024], got " + j["devices_per_node"].dump());
  h.devices_per_node = int(dpn);
  h.intra_node_bandwidth_gbps = num(j, "intra_node_bandwidth_gbps", 0, where);
  h.intra_node_latency_us = num(j, "intra_node_latency_us", 0, where);
  h.inter_node_bandwidth_gbps = num(j, "inter_node_bandwidth_gbps", 0, where);
  h.inter_node_latency_us = num(j, "inter_node_latency_us", 0, where);
  h.launch_overhead_us = num(j, "launch_overhead_us", 0, where);
  h.dequant_flops_per_weight = num(j, "dequant_flops_per_weight", 0, where);
  h.pack_flops_per_weight = num(j, "pack_flops_per_weight", 0, where);
  h.decode_gemv_efficiency = num(j, "decode_gemv_efficiency", 0, where);
  h.decode_gemv_flops_per_weight = num(j, "decode_gemv_flops_per_weight", 0, where);
  h.decode_gemv_bf16_efficiency = num(j, "decode_gemv_bf16_efficiency", 0, where);
  h.decode_gemv_bf16_flops_per_weight = num(j, "decode_gemv_bf16_flops_per_weight", 0, where);
  h.decode_gemv_bend_tokens = num(j, "decode_gemv_bend_tokens", 0, where);
  h.decode_gemv_many_efficiency = num(j, "decode_gemv_many_efficiency", 0, where);
  h.decode_gemv_bf16_many_efficiency = num(j, "decode_gemv_bf16_many_efficiency", 0, where);
  h.prefill_absorbed = flag(j, "prefill_absorbed", where);
  h.engine_collectives = flag(j, "engine_collectives", where);
  h.memory_usable_fraction = num(j, "memory_usable_fraction", h.memory_usable_fraction, where);
  h.memory_reserve_gib = num(j, "memory_reserve_gib", h.memory_reserve_gib, where);
  h.price_per_hour = num(j, "price_per_hour", 0, where);
  if (j.contains("efficiency")) {
    const json& e = j["efficiency"];
    if (!e.is_object()) throw Error(where + ": field 'efficiency': expected an object");
    const std::string w = where + " efficiency";
    known_keys(e, {"gemm", "gemm_heads", "attention_dense", "attention_dense_prefill", "attention_sparse_decode", "attention_sparse_prefill", "indexer",
                   "topk", "memory", "elementwise", "comm", "sustained"},
               w);
    h.eff.gemm = num(e, "gemm", h.eff.gemm, w);
    h.eff.gemm_heads = num(e, "gemm_heads", h.eff.gemm, w);
    h.eff.attention_dense = num(e, "attention_dense", h.eff.attention_dense, w);
    h.eff.attention_dense_prefill = num(e, "attention_dense_prefill", h.eff.attention_dense_prefill, w);
    h.eff.attention_sparse_decode = num(e, "attention_sparse_decode", h.eff.attention_sparse_decode, w);
    h.eff.attention_sparse_prefill = num(e, "attention_sparse_prefill", h.eff.attention_sparse_prefill, w);
    h.eff.indexer = num(e, "indexer", h.eff.indexer, w);
    h.eff.topk = num(e, "topk", h.eff.topk, w);
    h.eff.memory = num(e, "memory", h.eff.memory, w);
    h.eff.elementwise = num(e, "elementwise", h.eff.memory, w);
    h.eff.comm = num(e, "comm", h.eff.comm, w);
    h.eff.sustained = num(e, "sustained", h.eff.sustained, w);
  }
  auto positive = [&](const char* f, double v) {
    if (!(v > 0)) throw Error(where + ": field '" + std::string(f) + "': must be positive");
  };
  positive("bf16_tflops", h.bf16_tflops);
  positive("memory_bandwidth_gbps", h.memory_bandwidth_gbps);
  positive("memory_gib", h.memory_gib);
  positive("devices_per_node", h.devices_per_node);
  if (h.devices_per_node > 1) positive("intra_node_bandwidth_gbps", h.intra_node_bandwidth_gbps);  // 0: one device, no link
  if (h.memory_reserve_gib >= h.memory_gib) throw Error(where + ": field 'memory_reserve_gib': must be below memory_gib");
  for (double e : {h.eff.gemm, h.eff.gemm_heads, h.eff.attention_dense, h.eff.attention_dense_prefill, h.eff.attention_sparse_decode,
                   h.eff.attention_sparse_prefill, h.eff.indexer, h.eff.topk, h.eff.memory, h.eff.elementwise, h.eff.comm,
                   h.eff.sustained})
    if (!(e > 0 && e <= 1)) throw Error(where + ": efficiency factors must be in (0, 1]");
  if (!(h.memory_usable_fraction > 0 && h.memory_usable_fraction <= 1))
    throw Error(where + ": field 'memory_usable_fraction': must be in (0, 1]");
  return h;
}

std::string hardware_to_json(const Hardware& h) {
  json j = {{"name", h.name}, {"description", h.description}, {"bf16_tflops", h.bf16_tflops},
            {"fp8_tflops", h.fp8_tflops}, {"fp4_tflops", h.fp4_tflops},
            {"memory_bandwidth_gbps", h.memory_bandwidth_gbps}, {"memory_gib", h.memory_gib},
            {"devices_per_node", h.devices_per_node}, {"intra_node_bandwidth_gbps", h.intra_node_bandwidth_gbps},
            {"intra_node_latency_us", h.intra_node_latency_us}, {"inter_node_bandwidth_gbps", h.inter_node_bandwidth_gbps},
            {"inter_node_latency_us", h.inter_node_latency_us}, {"launch_overhead_us", h.launch_overhead_us},
            {"dequant_flops_per_weight", h.dequant_flops_per_weight}, {"pack_flops_per_weight", h.pack_flops_per_weight},
            {"decode_gemv_efficiency", h.decode_gemv_efficiency}, {"decode_gemv_flops_per_weight", h.decode_gemv_flops_per_weight},
            {"decode_gemv_bf16_efficiency", h.decode_gemv_bf16_efficiency},
            {"decode_gemv_bf16_flops_per_weight", h.decode_gemv_bf16_flops_per_weight},
            {"decode_gemv_bend_tokens", h.decode_gemv_bend_tokens}, {"decode_gemv_many_efficiency", h.decode_gemv_many_efficiency},
            {"decode_gemv_bf16_many_efficiency", h.decode_gemv_bf16_many_efficiency}, {"prefill_absorbed", h.prefill_absorbed},
            {"engine_collectives", h.engine_collectives},
            {"memory_usable_fraction", h.memory_usable_fraction}, {"memory_reserve_gib", h.memory_reserve_gib},
            {"price_per_hour", h.price_per_hour},
            {"efficiency", {{"gemm", h.eff.gemm}, {"gemm_heads", h.eff.gemm_heads}, {"attention_dense", h.eff.attention_dense},
                            {"attention_dense_prefill", h.eff.attention_dense_prefill},
                            {"attention_sparse_decode", h.eff.attention_sparse_decode},
                            {"attention_sparse_prefill", h.eff.attention_sparse_prefill},
                            {"indexer", h.eff.indexer}, {"topk", h.eff.topk},
                            {"memory", h.eff.memory}, {"elementwise", h.eff.elementwise}, {"comm", h.eff.comm},
                            {"sustained", h.eff.sustained}}},
            {"sources", h.sources}};
  return j.dump(2);
}

// A decode-role product's seconds per weight = a + b * tokens, through the one-token time t1
// and the kGemvTokens-token probe's rate (b: what each further token costs, its FMAs, x loads
// and its share of the re-widening its token group pays; a: streaming and widening the weight
// once), as an efficiency and FLOP-equivalents per weight: e = 2 / (b P), 2a / b. A missing
// probe, or noise that leaves b or a non-positive, leaves both 0 (the GEMM costing).
// Where b comes out below the FMA peak's 2 / P, the one-token product waited on memory (its
// time is the memory term's, which the simulator's max takes) and the line through it would
// understate each token's FMAs: then e = 1 and the kGemvTokens point alone sets the
// per-weight work (a one-token bf16 lm_head at 34 GB/s beside 205 GFLOP/s with 16 tokens
// put 16 tokens' FMAs at 6.5 ps a weight, under the 8.5 ps of a 234 GFLOP/s peak, and the
// clamped line costed one token at 1.3x its probe).
static void decode_gemv_line(double t1, double tokens_gflops, double P, double& efficiency, double& flops_per_weight) {
  if (!(tokens_gflops > 0 && t1 > 0)) return;
  const double tn = 2.0 * kGemvTokens / (tokens_gflops * 1e9);
  const double b = (tn - t1) / (kGemvTokens - 1), a = t1 - b;
  if (!(b > 0 && a > 0)) return;
  const double e = 2.0 / (b * P);
  if (e > 1.0) {
    efficiency = 1.0;
    flops_per_weight = std::max(0.0, tn * P - 2.0 * kGemvTokens);
    return;
  }
  efficiency = std::max(e, 1e-4);
  flops_per_weight = 2.0 * a / b;
}

// What each token costs past kGemvTokens, from the kGemvTokens- and kGemvTokensMany-token
// probes, as an efficiency, kept where it is more than the first line's (e below its
// efficiency): on the Zen 5 machine the bf16 tile's cost per weight was 46, 127 and 475 ps at
// 1, 16 and 64 tokens, where the first line alone put 64 tokens at 366.
static double decode_gemv_many_efficiency(double tokens_gflops, double many_gflops, double P, double first_efficiency) {
  if (!(first_efficiency > 0 && tokens_gflops > 0 && many_gflops > 0)) return 0;
  const double tn = 2.0 * kGemvTokens / (tokens_gflops * 1e9), tm = 2.0 * kGemvTokensMany / (many_gflops * 1e9);
  const double b = (tm - tn) / (kGemvTokensMany - kGemvTokens);
  if (!(b > 0) || !(2.0 / (b * P) < first_efficiency)) return 0;
  return std::clamp(2.0 / (b * P), 1e-4, 1.0);
}

Hardware local_hardware_from(int threads, double bw, double gflops, const KernelRates& k) {
  Hardware h;
  h.name = "local";
  char desc[768];
  std::snprintf(desc, sizeof desc,
                "this CPU, measured: %d threads, %.1f GB/s read, %.0f GFLOP/s fp32 FMA; engine kernels: GEMV bf16 %.1f GB/s (rows of %d; "
                "%.0f / %.0f GFLOP/s with %d / %d tokens) / fp8 %.1f GB/s (%.0f / %.0f GFLOP/s), GEMM fp8 %.0f (%d rows) / %.0f (%d rows) / %.0f "
                "(per head) GFLOP/s, "
                "indexer %.1f, sparse decode %.1f, prefill attention %.1f GFLOP/s, top-k %.0f Mkeys/s, element-wise %.1f GB/s, %.1f us per call",
                threads, bw, gflops, k.gemv_bf16_gbps, k.gemv_bf16_cols, k.gemv_bf16_tokens_gflops, k.gemv_bf16_many_gflops, kGemvTokens,
                kGemvTokensMany, k.gemv_fp8_gbps, k.gemv_fp8_tokens_gflops, k.gemv_fp8_many_gflops, k.gemm_small_gflops, kGemmSmallRows,
                k.gemm_large_gflops, kGemmLargeRows, k.gemm_heads_gflops,
                k.indexer_gflops, k.sparse_decode_gflops, k.prefill_attention_gflops, k.topk_keys_per_s / 1e6, k.elementwise_gbps,
                k.call_overhead_us);
  h.description = desc;
  // CPU kernels widen bf16/fp8 to fp32 and use the same FMA units, so all precisions share
  // the measured fp32 peak.
  h.bf16_tflops = h.fp8_tflops = gflops / 1e3;
  h.fp4_tflops = 0;
  // The bf16 GEMV can stream faster than the read probe (it keeps more loads in flight):
  // the profile's bandwidth is the faster of the two, so that no factor exceeds 1.
  h.memory_bandwidth_gbps = std::max(bw, k.gemv_bf16_gbps);
  h.memory_gib = physical_memory_bytes() / (1024.0 * 1024.0 * 1024.0);
  if (!(h.memory_gib > 0)) h.memory_gib = 16;
  h.devices_per_node = 1;
  h.memory_usable_fraction = 0.85;  // leave the OS and page cache their share
  h.memory_reserve_gib = 1;
  h.price_per_hour = 0;
  h.eff.comm = 1.0;
  h.eff.sustained = 1.0;  // the probes time the engine's own kernels at its shapes: nothing to discount
  // Every factor below is a measured kernel rate over a measured peak: the simulator's
  // roofline then reproduces each probe exactly, and end-to-end predictions come from
  // composing operators (never from end-to-end runs).
  const double P = gflops * 1e9;
  auto frac = [](double v) { return std::clamp(v, 1e-4, 1.0); };
  // Memory-bound operators stream like the bf16 GEMV (the lm_head, the largest of them).
  h.eff.memory = frac(k.gemv_bf16_gbps / h.memory_bandwidth_gbps);
  // GEMMs: time per low-precision weight element and call = (2 M + d + p) / (P e): 2M FLOPs
  // at efficiency e, d FLOP-equivalents of widening each fp8 weight, and p of repacking it
  // into panels (the packed GEMM only). The two packed-GEMM probes (M = 48 and 512 rows)
  // give e and d + p; the fp8 GEMV probe (M = 1, no packing) gives d.
  const double ms = kGemmSmallRows, ml = kGemmLargeRows;
  const double ts = 2.0 * ms / (k.gemm_small_gflops * 1e9), tl = 2.0 * ml / (k.gemm_large_gflops * 1e9);
  double pe = tl > ts ? 2.0 * (ml - ms) / (tl - ts) : k.gemm_large_gflops * 1e9;
  double per_call = pe * ts - 2.0 * ms;
  if (!(per_call >= 0)) {  // noise made the small GEMM look faster per row: no per-call term
    per_call = 0;
    pe = k.gemm_large_gflops * 1e9;
  }
  h.eff.gemm = frac(pe / P);
  // The absorbed prefill's per-head products the same way (kGemmLargeRows rows, the same
  // widening and pack per weight): the efficiency at which the plan reproduces their probe.
  // Without a measurement they take the large GEMM's.
  h.eff.gemm_heads = k.gemm_heads_gflops > 0 ? frac(k.gemm_heads_gflops * 1e9 * (1.0 + per_call / (2.0 * ml)) / P) : h.eff.gemm;
  const double gemv_weights_per_s = k.gemv_fp8_gbps * 1e9 / (1.0 + 4.0 / (128.0 * 128.0));
  // Below zero the fp8 GEMV streams as fast as memory allows: no widening term.
  h.dequant_flops_per_weight = std::clamp(pe / gemv_weights_per_s - 2.0, 0.0, per_call);
  h.pack_flops_per_weight = per_call - h.dequant_flops_per_weight;
  // Decode-role products, fp8 (from the expert GEMV probes) and bf16.
  decode_gemv_line(1.0 / gemv_weights_per_s, k.gemv_fp8_tokens_gflops, P, h.decode_gemv_efficiency, h.decode_gemv_flops_per_weight);
  // The bf16 tile the same way, from the one-token bf16 GEMV (2 bytes per weight).
  decode_gemv_line(2.0 / (k.gemv_bf16_gbps * 1e9), k.gemv_bf16_tokens_gflops, P, h.decode_gemv_bf16_efficiency,
                   h.decode_gemv_bf16_flops_per_weight);
  h.decode_gemv_bend_tokens = kGemvTokens;
  h.decode_gemv_many_efficiency = decode_gemv_many_efficiency(k.gemv_fp8_tokens_gflops, k.gemv_fp8_many_gflops, P, h.decode_gemv_efficiency);
  h.decode_gemv_bf16_many_efficiency =
      decode_gemv_many_efficiency(k.gemv_bf16_tokens_gflops, k.gemv_bf16_many_gflops, P, h.decode_gemv_bf16_efficiency);
  h.eff.indexer = frac(k.indexer_gflops * 1e9 / P);
  h.eff.topk = frac(k.topk_keys_per_s / P);
  h.eff.attention_sparse_decode = h.eff.attention_dense = frac(k.sparse_decode_gflops * 1e9 / P);
  // The engine runs every prompt's attention in the absorbed form over an f32 view of the
  // cache, with or without an indexer: one probe for both.
  h.prefill_absorbed = true;
  h.engine_collectives = true;  // its ranks run this engine's collectives
  h.eff.attention_sparse_prefill = h.eff.attention_dense_prefill = frac(k.prefill_attention_gflops * 1e9 / P);
  // Element-wise kernels (norms, RoPE, fp8 quantization of activations) run on one core at
  // a fraction of the bandwidth: the probe's rate in the operator table's bytes.
  h.eff.elementwise = frac(k.elementwise_gbps / h.memory_bandwidth_gbps);
  h.launch_overhead_us = k.call_overhead_us;
  h.sources = "measured by dsa::sim::measure_read_bandwidth_gbps, measure_peak_gflops and measure_kernel_rates (sim/probe.h)";
  return h;
}

Hardware measure_local_hardware(int threads, int gemv_bf16_cols) {
  const int t = threads > 0 ? threads : std::max(1, omp_get_max_threads());
  const double gflops = measure_peak_gflops(t);
  const double bw = measure_read_bandwidth_gbps(t);
  const KernelRates k = measure_kernel_rates(t, gemv_bf16_cols);
  return local_hardware_from(t, bw, gflops, k);
}

Hardware load_hardware(const std::string& name_or_path, int local_gemv_bf16_cols) {
  if (lower(name_or_path) == "local") return measure_local_hardware(0, local_gemv_bf16_cols);
  const std::string n = lower(name_or_path);
  for (const auto& b : kBuiltins)
    if (n == lower(b.name)) return hardware_from_json_text(b.json, std::string("built-in ") + b.name);
  if (!std::filesystem::exists(name_or_path)) builtin_hardware_json(name_or_path);  // throws the "unknown" message
  return hardware_from_json_text(read_text_file(name_or_path, "hardware profile", size_t(16) << 20), name_or_path);
}

}  // namespace dsa::sim
