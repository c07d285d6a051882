// The decode loop must not touch the heap: a counting global operator new, armed after a
// warm-up step, sees zero allocations over further decode steps (main model and MTP layer,
// every cache layout), and over the generator's speculative decoding loop.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <new>

#include "fixtures.h"
#include "model/forward.h"
#include "model/make_model.h"
#include "runtime/generator.h"

namespace {
std::atomic<bool> g_armed{false};
std::atomic<long> g_allocs{0};
}  // namespace

void* operator new(std::size_t n) {
  if (g_armed.load(std::memory_order_relaxed)) {
    g_allocs.fetch_add(1, std::memory_order_relaxed);
    if (std::getenv("DSA_NOALLOC_TRAP")) __builtin_trap();  // run under a debugger to see where
  }
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

using namespace dsa;

namespace {
// The tiny random checkpoint (with its MTP layer) in the test's scratch folder.
struct TinyModel {
  std::string dir = test::scratch("tiny");
  std::unique_ptr<Model> model;
  TinyModel() {
    MakeModelOptions o;
    o.preset = "tiny";
    o.out_dir = dir;
    o.verbose = false;
    make_model(o);
    model = Model::load(dir, true, false);
  }
};
const Model& tiny() {
  static TinyModel t;
  return *t.model;
}
}  // namespace

TEST(NoAlloc, DecodeStepsDoNotAllocate) {
  const Model* m = &tiny();
  for (CacheType cache : {CacheType::FP8, CacheType::FP8_656, CacheType::BF16, CacheType::F32}) {
    StateOptions so;
    so.max_ctx = 64;
    so.max_tokens = 16;
    so.cache = cache;
    so.mtp = true;
    State st(m->config, so);
    std::vector<int32_t> ids(40);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 37 + 11) % 1000);
    forward(*m, st, ids.data(), 16, {});
    forward_mtp(*m, st, st.h_final.data(), ids.data() + 1, 15, {});
    forward(*m, st, &ids[16], 1, {});  // warm-up step (thread pool, first-use buffers)
    g_allocs = 0;
    g_armed = true;
    for (int t = 17; t < 40; ++t) {
      forward(*m, st, &ids[size_t(t)], 1, {});
      forward_mtp(*m, st, st.h_final.data(), &ids[size_t(t)], 1, {});
    }
    g_armed = false;
    EXPECT_EQ(g_allocs.load(), 0) << "heap allocations inside the decode loop (cache type " << int(cache) << ")";
  }
}

TEST(NoAlloc, SpeculativeDecodingDoesNotAllocate) {
  // The generator with the MTP layer, greedy and sampled: counting starts once a few
  // tokens are out (the first steps size the threads' scratch), and stops at the end.
  const Model* m = &tiny();
  for (bool greedy : {true, false}) {
    Generator gen(*m, nullptr, GeneratorOptions{96, 512, CacheType::FP8, /*mtp=*/true});
    GenerateOptions g;
    g.max_new_tokens = 40;
    g.sampling.greedy = greedy;
    g.stop_on_eos = false;
    std::vector<int32_t> prompt(12);
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t((i * 53 + 7) % 1000);
    int seen = 0;
    g_allocs = 0;
    const auto r = gen.generate(prompt, g, {}, [&](int32_t) {
      if (++seen == 4) g_armed = true;
      return true;
    });
    g_armed = false;
    EXPECT_EQ(r.tokens.size(), 40u);
    EXPECT_GT(r.drafted, 10);
    EXPECT_EQ(g_allocs.load(), 0) << "heap allocations inside the speculative decoding loop (greedy " << greedy << ")";
  }
}
