// The machine probes behind `dsa plan --hardware local` and `dsa bench`: they run the engine's
// kernels at DeepSeek-V3.2's shapes, so this test is labelled slow (seconds in a release build,
// minutes under the sanitizers, which the kernel twin tests already cover).
#include <gtest/gtest.h>

#include "kernels/kernels.h"
#include "sim/probe.h"

using namespace dsa::sim;

TEST(SimProbe, MeasuresSomething) {
  // Values depend on the machine; only check that the probes run and report a rate.
  EXPECT_GT(measure_read_bandwidth_gbps(1), 0.0);
  EXPECT_GT(measure_peak_gflops(1), 0.0);
  // The bf16 dot product's peak where the CPU has the instruction, and only there.
  if (dsa::kernels::bf16_dot_supported()) EXPECT_GT(measure_bf16_dot_peak_gflops(1), 0.0);
  else EXPECT_EQ(measure_bf16_dot_peak_gflops(1), 0.0);
  // The AMX tile product's peak in the amx tier, and only there.
  if (dsa::kernels::isa() == dsa::kernels::Isa::Amx) EXPECT_GT(measure_amx_peak_gflops(1), 0.0);
  else EXPECT_EQ(measure_amx_peak_gflops(1), 0.0);
  EXPECT_GT(physical_memory_bytes(), 0.0);
  const KernelRates k = measure_kernel_rates(1, 7168);  // DeepSeek-V3.2's hidden size: 4,681 rows of 7,168
  EXPECT_EQ(k.gemv_bf16_cols, 7168);
  for (double v : {k.gemv_bf16_gbps, k.gemv_fp8_gbps, k.gemv_fp8_tokens_gflops, k.gemm_small_gflops, k.gemm_large_gflops, k.gemm_heads_gflops, k.indexer_gflops,
                   k.topk_keys_per_s, k.sparse_decode_gflops, k.prefill_attention_gflops, k.gemv_bf16_tokens_gflops, k.gemv_fp8_many_gflops, k.gemv_bf16_many_gflops, k.call_overhead_us,
                   k.elementwise_gbps})
    EXPECT_GT(v, 0.0);
}
