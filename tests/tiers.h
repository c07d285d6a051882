#pragma once
// The instruction-set tiers the kernel and golden tests run on: the ones this CPU runs
// natively, the avx512 tier's kernels once more on SIMDe's emulation of the AVX-512
// intrinsics, and the amx tier on a model of the tile unit (its AVX-512 code native), so
// that those tiers' logic is checked on machines without them (the test binaries link the
// emulated builds). A tier the CPU lacks is a skipped test that names it.
#include <gtest/gtest.h>

#include <ostream>
#include <string>

#include "kernels/cpu/cpu.h"
#include "kernels/kernels.h"

namespace dsa::kernels::cpu {
const Avx512Kernels& avx512_emulated_kernels();  // avx512.cpp built on SIMDe
const AmxKernels& amx_emulated_kernels();        // amx.cpp built on the tile model
}

namespace dsa::test {

struct Tier {
  const char* name;
  kernels::Isa isa;
  bool emulated;
};
inline const Tier kTiers[] = {{"generic", kernels::Isa::Generic, false},
                              {"avx2", kernels::Isa::Avx2, false},
                              {"avx512", kernels::Isa::Avx512, false},
                              {"avx512_emulated", kernels::Isa::Avx512, true},
                              {"amx", kernels::Isa::Amx, false},
                              {"amx_emulated", kernels::Isa::Amx, true}};
inline void PrintTo(const Tier& t, std::ostream* os) { *os << t.name; }  // test names and logs
inline std::string tier_name(const ::testing::TestParamInfo<Tier>& i) { return i.param.name; }

// Puts a tier in use (false: the CPU cannot run it); leave_tier goes back to the best one.
inline bool enter_tier(const Tier& t) {
  if (t.emulated && t.isa == kernels::Isa::Amx) {
    if (!kernels::isa_supported(kernels::Isa::Avx512)) return false;  // the tile model's AVX-512 code is native
    kernels::cpu::emulate_avx512(nullptr);
    kernels::cpu::emulate_amx(&kernels::cpu::amx_emulated_kernels());
    return true;
  }
  if (t.emulated) {
    kernels::cpu::emulate_avx512(&kernels::cpu::avx512_emulated_kernels());
    return true;
  }
  if (!kernels::isa_supported(t.isa)) return false;
  kernels::set_isa(t.isa);
  return true;
}
inline void leave_tier() { kernels::cpu::emulate_avx512(nullptr); }

}  // namespace dsa::test

// In a fixture's SetUp: the tier in use, or the test skipped with the tier's name.
#define DSA_ENTER_TIER(t)                 \
  if (!::dsa::test::enter_tier(t))        \
  GTEST_SKIP() << "tier " << (t).name << ": this CPU cannot run it (it has " << ::dsa::kernels::cpu_features() << ")"
