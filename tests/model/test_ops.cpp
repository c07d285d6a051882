// ops.safetensors: the fp8 code table, act_quant (plain and ue8m0) and the Hadamard-128
// transform, bit for bit, for both kernel backends where a twin exists.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "fixtures.h"
#include "io/safetensors.h"
#include "kernels/cpu/cpu.h"
#include "kernels/kernels.h"
#include "kernels/ref/ref.h"

using namespace dsa;

namespace {

std::string ops_path() { return test::golden_dir() + "/ops.safetensors"; }

template <class T>
std::vector<T> read(const TensorInfo& t) {
  std::vector<T> v(size_t(t.numel()));
  std::memcpy(v.data(), t.data, v.size() * sizeof(T));
  return v;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TEST(Ops, Fp8E4M3Table) {
  DSA_REQUIRE_FIXTURE(ops_path());
  const auto st = SafeTensors::open(ops_path());
  const auto want = read<float>(st.get("fp8_e4m3_values"));
  ASSERT_EQ(want.size(), 256u);
  for (int i = 0; i < 256; ++i) {
    const float got = fp8_e4m3_to_f32(uint8_t(i));
    if (i == 0x7f || i == 0xff) EXPECT_TRUE(std::isnan(got)) << "code " << i;
    else EXPECT_EQ(bits(got), bits(want[size_t(i)])) << "code 0x" << std::hex << i;
  }
}

TEST(Ops, Fp8EncodeRoundTripsEveryCode) {
  for (int i = 0; i < 256; ++i) {
    if (i == 0x7f || i == 0xff) continue;
    const float v = fp8_e4m3_to_f32(uint8_t(i));
    const uint8_t back = f32_to_fp8_e4m3(v);
    if (v == 0.0f) EXPECT_EQ(back & 0x7f, 0) << i;
    else EXPECT_EQ(back, uint8_t(i)) << "code 0x" << std::hex << i;
  }
}

void check_act_quant(const char* kind, bool ue8m0) {
  DSA_REQUIRE_FIXTURE(ops_path());
  const auto st = SafeTensors::open(ops_path());
  const TensorInfo& in = st.get("act_quant.input");
  const auto x = read<float>(in);
  const auto codes = read<uint8_t>(st.get(std::string("act_quant.") + kind + ".codes"));
  const auto scales = read<float>(st.get(std::string("act_quant.") + kind + ".scales"));
  const int rows = int(in.shape[0]), cols = int(in.shape[1]), nb = (cols + 127) / 128;
  std::vector<uint8_t> c(static_cast<size_t>(cols));
  std::vector<float> s(static_cast<size_t>(nb));
  for (int r = 0; r < rows; ++r) {
    kernels::act_quant_fp8(&x[size_t(r) * size_t(cols)], cols, 128, ue8m0, c.data(), s.data());
    for (int b = 0; b < nb; ++b)
      ASSERT_EQ(bits(s[size_t(b)]), bits(scales[size_t(r) * size_t(nb) + size_t(b)])) << kind << " scale row " << r << " block " << b;
    for (int i = 0; i < cols; ++i)
      ASSERT_EQ(c[size_t(i)], codes[size_t(r) * size_t(cols) + size_t(i)]) << kind << " code row " << r << " col " << i << " x=" << x[size_t(r) * size_t(cols) + size_t(i)];
  }
}

TEST(Ops, ActQuantPlain) { check_act_quant("plain", false); }
TEST(Ops, ActQuantUe8m0) { check_act_quant("ue8m0", true); }

TEST(Ops, Hadamard128BothBackends) {
  DSA_REQUIRE_FIXTURE(ops_path());
  const auto st = SafeTensors::open(ops_path());
  const auto in = read<float>(st.get("hadamard128.input"));
  const auto want = read<float>(st.get("hadamard128.output"));
  const int n = int(in.size() / 128);
  for (Backend b : {Backend::Ref, Backend::Cpu}) {
    std::vector<float> x = in;
    if (b == Backend::Ref) kernels::ref::hadamard128(x.data(), n);
    else kernels::cpu::hadamard128(x.data(), n);
    double mx = 0, err = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      mx = std::max(mx, double(std::fabs(want[i])));
      err = std::max(err, double(std::fabs(x[i] - want[i])));
    }
    // f32 butterflies round differently from the f64 reference by a few ulps.
    EXPECT_LE(err / mx, 1e-6) << (b == Backend::Ref ? "ref" : "cpu");
  }
}

}  // namespace
