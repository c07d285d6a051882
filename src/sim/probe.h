#pragma once
// Measured peaks of this CPU, used by the `local` hardware profile and by `dsa bench` to
// express its own results as a fraction of what the machine can do.
#include "core/threads.h"

namespace dsa::sim {

// Sustained streaming-read bandwidth in GB/s (1e9 bytes/s), best of several passes over a
// buffer much larger than the last-level cache. threads <= 0 means all OpenMP threads.
double measure_read_bandwidth_gbps(int threads = 0);

// Peak fp32 FMA throughput in GFLOP/s (an FMA counts as 2 FLOPs) at the width of the
// kernels' tier (kernels::isa()): independent accumulator chains in 512-bit registers for
// avx512, 256-bit for avx2, a scalar loop for generic.
double measure_peak_gflops(int threads = 0);

// Peak throughput of AVX512-BF16's dot product (vdpbf16ps: 32 bf16 products and their sums
// into 16 f32 lanes, 64 FLOPs), the instruction the indexer scan runs on (kernels::bf16_dot());
// 0 where the CPU lacks it.
double measure_bf16_dot_peak_gflops(int threads = 0);

// Peak throughput of the AMX BF16 tile product (TDPBF16PS: 16 x 16 outputs of 32-product
// sums, 16384 FLOPs), the amx tier's prefill GEMM instruction; 0 in other tiers.
double measure_amx_peak_gflops(int threads = 0);

// Total physical memory in bytes (0 if it cannot be read): core/threads.h.
using dsa::physical_memory_bytes;

// What the engine's own CPU kernels (kernels/kernels.h, the optimized backend) reach on
// small synthetic operands: the `local` profile turns these into its efficiency factors,
// so that `dsa plan --hardware local` composes end-to-end predictions from measured
// operators. The probes run interleaved, fifteen rounds of a few calls each; a rate is the
// median over rounds of each round's mean call time (as `dsa bench` takes the median of
// repeats, each a mean over tokens). About 4 s on two cores.
struct KernelRates {
  double gemv_bf16_gbps = 0;      // one-token GEMV over a 64 MiB bf16 matrix of gemv_bf16_cols columns, from DRAM
  int gemv_bf16_cols = 0;         // its row length: the planned model's hidden size (its lm_head's rows)
  double gemv_fp8_gbps = 0;       // one-token linear_multi over sixteen fp8 [512 x 2048] and one over eight
                                  // [2048 x 512] matrices (an expert layer's mix, 24 MiB, from DRAM)
  double gemv_fp8_tokens_gflops = 0;  // the same linear_multi calls with kGemvTokens tokens per job (a
                                      // batched decode step's products, the decode-role kernels)
  double gemv_bf16_tokens_gflops = 0;  // the bf16 GEMV above with kGemvTokens tokens (a batched decode
                                       // step's lm_head, the decode-role bf16 tile)
  double gemv_fp8_many_gflops = 0;   // the fp8 and bf16 probes above with kGemvTokensMany tokens: past
  double gemv_bf16_many_gflops = 0;  // kGemvTokens a token costs more than the line from one token to
                                     // kGemvTokens says (the tile is compute-bound there)
  double gemm_small_gflops = 0;   // eight experts' fp8 GEMMs (gate and up [512 x 2048], down [2048 x
                                  // 512]) of kGemmSmallRows rows and their silu * up in a parallel
                                  // loop, one expert per thread, weights from DRAM (prefill's experts)
  double gemm_large_gflops = 0;   // one fp8 [1024 x 2048] GEMM of kGemmLargeRows rows across the threads (a dense projection)
  double gemm_heads_gflops = 0;   // 16 heads' [128 x 512] fp8 products, one call per head in each direction,
                                  // kGemmLargeRows rows (the absorbed prefill's kv_b halves)
  double indexer_gflops = 0;      // indexer_scores: 16 heads over 16,384 fp8 keys, from DRAM
  double topk_keys_per_s = 0;     // topk: 2,048 of 16,384 scores
  double sparse_decode_gflops = 0;   // mla_sparse_decode: 16 heads, 2,048 of 16,384 fp8 latents, from DRAM
  double prefill_attention_gflops = 0;  // mla_sparse_decode over an f32 latent view, 32 queries x 512 of 1,024
                                        // keys, 16 heads, one query per thread (the engine's prefill attention)
  double call_overhead_us = 0;    // one tiny kernel call (a parallel region's fork and join)
  double elementwise_gbps = 0;    // norms, RoPE, indexer quantization, silu * up and cache writes of a
                                  // kEltTokens-token chunk, in the operator table's bytes per second
};
constexpr int kGemmSmallRows = 48, kGemmLargeRows = 512, kEltTokens = 256, kGemvTokens = 16, kGemvTokensMany = 64;
// gemv_bf16_cols: the bf16 GEMV probe's row length. The GEMV pays a fixed cost per row on top
// of its bytes (about 26 ns per row on two threads of the development machine: rows of 1024
// stream at 22 GB/s where rows of 8192 reach 29), so the probe streams rows as long as those
// of the weight it stands for, the lm_head's [vocab x hidden].
KernelRates measure_kernel_rates(int threads = 0, int gemv_bf16_cols = 4096);

}  // namespace dsa::sim
