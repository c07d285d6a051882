#pragma once
// Hardware profiles: peak rates, memory, interconnect, and the efficiency factors that turn
// peaks into what tuned kernels reach. Built-in profiles are JSON text (the same schema a
// user's --hardware FILE.json uses); `local` is measured on the spot. docs/PLAN.md lists the
// source of every number.
#include <string>
#include <vector>

namespace dsa::sim {

// Fraction of a peak that the best public kernels sustain for each class of operator.
struct Efficiency {
  double gemm = 0.70;                      // fp8/bf16/fp4 GEMMs and grouped MoE GEMMs
  // The absorbed prefill's per-head products (kv_b's halves, one head's small GEMM at a time
  // on the CPU engine); a profile without it uses `gemm`.
  double gemm_heads = 0.70;
  double attention_dense = 0.67;           // dense MLA decode (absorbed, MQA form), compute side
  double attention_dense_prefill = 0.60;   // dense prefill attention (MHA form, or absorbed where the profile says)
  double attention_sparse_decode = 0.41;   // sparse MLA decode with an fp8 cache (gather + dequant)
  double attention_sparse_prefill = 0.65;  // sparse MLA prefill
  double indexer = 0.70;                   // lightning-indexer scoring (fp8 MQA logits), compute side
  double topk = 0.70;                      // top-k selection: one operation per scored key
  double memory = 0.85;                    // achieved / peak memory bandwidth
  double elementwise = 0.85;               // norms, RoPE, activation quantization, silu: achieved / peak
                                           // bandwidth (a profile without it uses `memory`)
  double comm = 0.80;                      // achieved / peak link bandwidth
  // Fraction of the kernels' compute rates above (each taken from a kernel benchmark run
  // alone) that a serving system sustains end to end; it multiplies every compute-bound
  // rate, not memory or link bandwidth. Fit once, to SGLang's GB200 prefill (one NVLink
  // domain, so compute-bound with no scale-out all-to-all), and checked against the other
  // published figures in docs/PLAN.md. The compute-cut H20 profile sets 1 (its published
  // serving figure beats its kernel rates); `local` measures the engine's kernels as the
  // engine runs them and uses 1.
  double sustained = 0.46;
};

// The engine's CPU kernels stream one to three rows through the GEMV path and switch to
// the packed GEMM from this many rows on (kernels/cpu/cpu_linear.cpp).
constexpr double kPackedGemmMinRows = 4;

struct Hardware {
  std::string name;
  std::string description;
  double bf16_tflops = 0;   // dense (no structured sparsity)
  double fp8_tflops = 0;    // 0: no fp8 units, fp8 weights run at the bf16 rate
  double fp4_tflops = 0;    // 0: no fp4 units, fp4 weights run at the fp8 rate
  double memory_bandwidth_gbps = 0;  // GB/s, 1e9
  double memory_gib = 0;             // capacity per device
  int devices_per_node = 8;          // size of the scale-up (NVLink-class) domain
  double intra_node_bandwidth_gbps = 0;  // per device, per direction
  double intra_node_latency_us = 0;
  double inter_node_bandwidth_gbps = 0;  // per device (its NIC share), per direction
  double inter_node_latency_us = 0;
  double launch_overhead_us = 0;     // per operator invocation
  // Extra work per low-precision weight element where the compute units cannot consume the
  // format directly (CPUs widen fp8 to fp32 before the FMA): charged as this many FLOPs.
  double dequant_flops_per_weight = 0;
  // Extra work per weight element of a GEMM that repacks its weight panels before the FMA
  // loop (the CPU GEMM path, from kPackedGemmMinRows rows on; a GEMV streams and packs
  // nothing), in the same FLOP-equivalents.
  double pack_flops_per_weight = 0;
  // Decode-phase weight products where they run a GEMV whose cost grows with the tokens it
  // carries (the CPU engine's decode-role kernels: batch-invariant, never the packed GEMM):
  // the FMA work at this efficiency plus decode_gemv_flops_per_weight FLOP-equivalents per
  // low-precision weight (its widening and loads). 0: decode products are costed as GEMMs.
  double decode_gemv_efficiency = 0;
  double decode_gemv_flops_per_weight = 0;
  // The same for the bf16 decode-role tile (a batched step's lm_head, router and indexer
  // weights), whose cost per token differs from the fp8 kernels'. 0: bf16 decode products
  // use the fp8 pair above.
  double decode_gemv_bf16_efficiency = 0;
  double decode_gemv_bf16_flops_per_weight = 0;
  // Past decode_gemv_bend_tokens tokens per weight each further token costs more than the
  // lines above say (the tile turns compute-bound): 2 FLOPs per weight at these
  // efficiencies (fp8, bf16) instead. 0: the lines hold at any token count.
  double decode_gemv_bend_tokens = 0;
  double decode_gemv_many_efficiency = 0;
  double decode_gemv_bf16_many_efficiency = 0;
  // Prefill attention runs in the absorbed (MQA) form at every prompt length, as the CPU
  // engine does (model/mla.cpp: a token's attention then depends on its inputs and the
  // cache alone). false: the expanded (MHA) form while it costs fewer FLOPs, as DeepSeek's
  // GPU kernels choose for short prompts.
  bool prefill_absorbed = false;
  // Communication as this engine's MPI runtime does it (model/mla.cpp, mlp.cpp, moe.cpp):
  // tensor parallelism all-gathers whole f32 outputs (two gathers per attention and per MLP)
  // and sums the experts of every token with one all-reduce, data-parallel attention moves
  // tokens by all-gather and reduce-scatter or by all-to-all as moe_alltoall_pays chooses,
  // and a step runs as one batch. false: the GPU frameworks' collectives (all-reduces of
  // bf16 partial sums, DeepEP's fp8 dispatch and bf16 combine, two overlapped micro-batches).
  bool engine_collectives = false;
  double memory_usable_fraction = 0.92;  // allocator headroom / fragmentation
  double memory_reserve_gib = 4;         // runtime context, communication buffers, graphs
  double price_per_hour = 0;             // $ per device-hour (a rental assumption)
  Efficiency eff;
  std::string sources;

  double peak_flops(int precision_bits) const;  // 4, 8, 16 -> FLOP/s
  double memory_bytes() const { return memory_gib * 1024.0 * 1024.0 * 1024.0; }
};

std::vector<std::string> builtin_hardware_names();  // includes "local"
std::string builtin_hardware_json(const std::string& name);  // not for "local"
Hardware hardware_from_json_text(const std::string& text, const std::string& where);
std::string hardware_to_json(const Hardware& hw);
// Measures this CPU (read bandwidth, FMA peak, physical memory, and the rates of the engine's
// own kernels, see sim/probe.h) with `threads` (<= 0: all) and builds the `local` profile.
// gemv_bf16_cols: row length of the bf16 GEMV probe (the planned model's hidden size).
Hardware measure_local_hardware(int threads = 0, int gemv_bf16_cols = 4096);
// The `local` profile from given measurements (no timing: what measure_local_hardware does
// with its numbers, testable by hand). read_gbps / fma_gflops: the streaming-read and FMA
// probes; rates: the kernel probes.
struct KernelRates;
Hardware local_hardware_from(int threads, double read_gbps, double fma_gflops, const KernelRates& rates);
// A built-in name (case-insensitive), "local", or a path to a profile JSON; `local` probes its
// bf16 GEMV with rows of local_gemv_bf16_cols (the planned model's hidden size).
Hardware load_hardware(const std::string& name_or_path, int local_gemv_bf16_cols = 4096);

}  // namespace dsa::sim
