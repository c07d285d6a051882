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
#include "runtime/engine.h"
#include "runtime/generator.h"

namespace {
std::atomic<bool> g_armed{false};
std::atomic<long> g_allocs{0};
}  // namespace

// The replacement allocation functions are malloc and free underneath; GCC's mismatch check
// at -O1 takes the free inside operator delete[] for a mismatch with new[].
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
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
#pragma GCC diagnostic pop

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
    EngineOptions eo;
    eo.cache = cache;
    eo.block_size = 8;  // several blocks per sequence: decode crosses block boundaries
    eo.max_ctx = 64;
    eo.max_seqs = 1;
    eo.max_step_tokens = 16;
    eo.cache_tokens = 64;
    eo.mtp = true;
    Engine e(*m, eo);
    const SeqId s = e.add({}, true);
    std::vector<int32_t> ids(40);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 37 + 11) % 1000);
    const StepItem pre{s, ids.data(), 16, false, 1, 0};
    e.step(std::span<const StepItem>(&pre, 1));
    std::vector<float> h(e.hidden(0), e.hidden(0) + 16 * m->config.hidden_size);
    const MtpItem mpre{s, ids.data() + 1, h.data(), 15, false, 1};
    e.step_mtp(std::span<const MtpItem>(&mpre, 1));
    const StepItem warm{s, &ids[16], 1, true, 1, 0};
    e.step(std::span<const StepItem>(&warm, 1));  // warm-up step (thread pool, first-use buffers)
    g_allocs = 0;
    g_armed = true;
    for (int t = 17; t < 40; ++t) {
      const StepItem it{s, &ids[size_t(t)], 1, true, 1, 0};
      e.step(std::span<const StepItem>(&it, 1));
      const MtpItem mi{s, &ids[size_t(t)], e.hidden(0), 1, true, 1};
      e.step_mtp(std::span<const MtpItem>(&mi, 1));
    }
    g_armed = false;
    EXPECT_EQ(g_allocs.load(), 0) << "heap allocations inside the decode loop (cache type " << int(cache) << ")";
  }
}

// Batched steps: 8 sequences decoding together while another prefills in chunks, their
// blocks growing across boundaries and one sequence released and replaced mid-way
// (publishing its blocks to the prefix cache); the steps allocate nothing.
TEST(NoAlloc, BatchedStepsDoNotAllocate) {
  const Model* m = &tiny();
  EngineOptions eo;
  eo.block_size = 4;
  eo.max_ctx = 64;
  eo.max_seqs = 9;
  eo.max_step_tokens = 64;
  eo.cache_tokens = 9 * 64;
  Engine e(*m, eo);
  std::vector<int32_t> ids(64);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 29 + 3) % 1000);
  std::vector<SeqId> seqs;
  for (int i = 0; i < 8; ++i) seqs.push_back(e.add());
  std::vector<StepItem> items;
  items.reserve(9);
  for (SeqId s : seqs) items.push_back(StepItem{s, ids.data(), 4 + int(s), false, 1, 0});
  e.step(items);  // prefill: sizes the GEMM's buffers
  SeqId p = e.add();
  int p_done = 0;
  for (int t = 0; t < 24; ++t) {
    if (t == 1) {
      g_allocs = 0;
      g_armed = true;
    }
    items.clear();
    for (SeqId s : seqs) items.push_back(StepItem{s, &ids[size_t(t)], 1, true, 1, 0});
    if (p_done + 8 <= 48) {
      items.push_back(StepItem{p, &ids[size_t(p_done)], 8, false, 1, 0});
      p_done += 8;
    }
    e.step(items);
  }
  g_armed = false;
  EXPECT_EQ(g_allocs.load(), 0) << "heap allocations inside batched steps";
}

TEST(NoAlloc, SpeculativeDecodingDoesNotAllocate) {
  // The generator with the MTP layer, greedy and sampled: counting starts once a few
  // tokens are out (the first steps size the threads' scratch), and stops at the end.
  const Model* m = &tiny();
  for (bool greedy : {true, false}) {
    EngineOptions eo;
    eo.max_ctx = 96;
    eo.max_seqs = 1;
    eo.max_step_tokens = 96;
    eo.cache_tokens = 96;
    eo.mtp = true;
    Engine engine(*m, eo);
    Generator gen(engine, nullptr, GeneratorOptions{512, /*mtp=*/true});
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
