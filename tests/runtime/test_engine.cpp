// The batched engine: the block pool and prefix cache, and the numerics contracts of a
// step shared by many sequences (bitwise batch invariance, paged = contiguous, a prefix
// hit = a miss), over every golden model found at run time.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "fixtures.h"
#include "runtime/block_pool.h"
#include "runtime/engine.h"
#include "runtime/teacher_forcing.h"

using namespace dsa;

namespace {

// ---- block pool ------------------------------------------------------------------

std::vector<int32_t> block_tokens(int bs, int salt) {
  std::vector<int32_t> t(static_cast<size_t>(bs));
  for (int i = 0; i < bs; ++i) t[size_t(i)] = salt * 100 + i;
  return t;
}

TEST(BlockPool, ReferenceCountsAndFreeing) {
  BlockPool p(4, 2);
  const int32_t a = p.allocate(), b = p.allocate();
  EXPECT_NE(a, b);
  EXPECT_EQ(p.free_blocks(), 2);
  p.ref(a);
  EXPECT_EQ(p.refcount(a), 2);
  p.unref(a);
  EXPECT_EQ(p.free_blocks(), 2);
  p.unref(a);
  EXPECT_EQ(p.free_blocks(), 3);  // unpublished: straight back to the free list
  p.allocate();
  p.allocate();
  p.allocate();
  EXPECT_EQ(p.allocate(), BlockPool::kNone);  // every block held
  p.unref(b);
}

TEST(BlockPool, PublishedBlocksAreSharedThenEvictedLeastRecentlyUsedFirst) {
  const int bs = 3;
  BlockPool p(3, bs);
  std::vector<int32_t> blk;
  std::vector<uint64_t> h;
  for (int i = 0; i < 3; ++i) {
    const auto t = block_tokens(bs, i);
    blk.push_back(p.allocate());
    h.push_back(BlockPool::chain(0, t.data(), bs, 7));
    p.publish(blk.back(), h.back(), 0, t.data());
  }
  // A lookup shares the block (a hit takes a reference); a different parent or different
  // tokens miss.
  const auto t1 = block_tokens(bs, 1);
  EXPECT_EQ(p.lookup(h[1], 0, t1.data()), blk[1]);
  EXPECT_EQ(p.refcount(blk[1]), 2);
  EXPECT_EQ(p.lookup(h[1], 12345, t1.data()), BlockPool::kNone);
  const auto other = block_tokens(bs, 9);
  EXPECT_EQ(p.lookup(h[1], 0, other.data()), BlockPool::kNone);
  EXPECT_EQ(p.stats().queries, 3);
  EXPECT_EQ(p.stats().hits, 1);
  // Released in the order 2, 0, 1 (block 1 twice): evicted in that order.
  p.unref(blk[2]);
  p.unref(blk[0]);
  p.unref(blk[1]);
  p.unref(blk[1]);
  EXPECT_EQ(p.cached_blocks(), 3);
  EXPECT_EQ(p.allocate(), blk[2]);
  EXPECT_EQ(p.allocate(), blk[0]);
  EXPECT_EQ(p.stats().evictions, 2);
  const auto t0 = block_tokens(bs, 0);
  EXPECT_EQ(p.lookup(h[0], 0, t0.data()), BlockPool::kNone);  // evicted: no longer found
  EXPECT_EQ(p.lookup(h[1], 0, t1.data()), blk[1]);            // still cached
}

TEST(BlockPool, HashTableSurvivesChurn) {
  // Many publish / evict rounds through a small table: every published block stays
  // findable until it is evicted (backward-shift deletion keeps probe runs intact).
  const int bs = 2, n = 16;
  BlockPool p(n, bs);
  std::vector<std::pair<int32_t, int>> live;  // block, salt
  for (int round = 0; round < 400; ++round) {
    const int32_t b = p.allocate();
    ASSERT_NE(b, BlockPool::kNone);
    live.erase(std::remove_if(live.begin(), live.end(), [&](auto& e) { return e.first == b; }), live.end());
    const auto t = block_tokens(bs, round);
    p.publish(b, BlockPool::chain(0, t.data(), bs, 1), 0, t.data());
    p.unref(b);
    live.emplace_back(b, round);
    for (auto& [blk, salt] : live) {
      const auto tt = block_tokens(bs, salt);
      const int32_t got = p.lookup(BlockPool::chain(0, tt.data(), bs, 1), 0, tt.data());
      ASSERT_EQ(got, blk) << "round " << round << " salt " << salt;
      p.unref(got);
    }
  }
}

// ---- engine on the golden models ------------------------------------------------------

struct Golden {
  std::string name;
  std::unique_ptr<Model> model;
  std::vector<int32_t> ids;
  int prompt_len = 0;
  CacheType cache = CacheType::F32;
};

std::vector<Golden> golden_models() {
  std::vector<Golden> out;
  const auto cases = test::golden_cases();
  EXPECT_TRUE(test::golden_cases_complete(cases));
  for (const auto& name : cases) {
    const std::string dir = test::golden_dir() + "/" + name;
    std::ifstream in(dir + "/case.json");
    const auto cj = nlohmann::json::parse(in);
    Golden g;
    g.name = name;
    g.model = Model::load(dir + "/model", true);
    g.ids = cj.at("ids").get<std::vector<int32_t>>();
    g.prompt_len = cj.at("prompt_len").get<int>();
    g.cache = cj.at("kv_cache").get<std::string>() == "fp8" ? CacheType::FP8 : CacheType::F32;
    out.push_back(std::move(g));
  }
  return out;
}

uint64_t mix(uint64_t& x) {
  x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
  return x * 0x2545f4914f6cdd1dull;
}

// A sequence's script: its ids, its prefill chunks, then decode tokens, starting at `start`.
struct Script {
  std::vector<int32_t> ids;
  std::vector<int> chunks;  // prefill chunk sizes, then 1-token decode steps to the end
  int start = 0;            // the step it joins at
};

std::vector<Script> scripts(const Model& m, int count, uint64_t seed) {
  std::vector<Script> out(static_cast<size_t>(count));
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (int i = 0; i < count; ++i) {
    Script& s = out[size_t(i)];
    const int len = 6 + int(mix(x) % 40), prompt = 1 + int(mix(x) % uint64_t(len - 1));
    s.ids.resize(size_t(len));
    for (auto& id : s.ids) id = int32_t(mix(x) % uint64_t(m.config.vocab_size));
    for (int done = 0; done < prompt;) {
      const int c = std::min(prompt - done, 1 + int(mix(x) % 7));
      s.chunks.push_back(c);
      done += c;
    }
    s.start = int(mix(x) % 12);
  }
  return out;
}

EngineOptions small_engine(const Model& m, CacheType cache, int seqs, int block_size) {
  EngineOptions eo;
  eo.cache = cache;
  eo.block_size = block_size;
  eo.max_ctx = 64;
  eo.max_seqs = seqs;
  eo.max_step_tokens = 8 * seqs;
  eo.cache_tokens = int64_t(seqs) * 64 + 4 * block_size;
  eo.mtp = m.weights.mtp.has_value();
  return eo;
}

// Runs the scripts through one engine, all stepping together (each joins at its start
// step), or (alone) each on a fresh engine; returns each one's logits rows, step by step.
std::vector<std::vector<float>> run_scripts(const Model& m, CacheType cache, const std::vector<Script>& sc, bool alone) {
  const int V = m.config.vocab_size;
  std::vector<std::vector<float>> out(sc.size());
  auto drive = [&](Engine& e, const std::vector<size_t>& which) {
    struct Live { size_t i; SeqId s; size_t step = 0; int pos = 0; };
    std::vector<Live> live;
    std::vector<StepItem> items;
    for (int t = 0;; ++t) {
      for (size_t i : which)
        if (alone ? t == 0 : sc[i].start == t) live.push_back({i, e.add(), 0, 0});
      if (live.empty()) {
        bool later = false;
        for (size_t i : which) later |= !alone && sc[i].start > t;
        if (!later) break;
        continue;
      }
      items.clear();
      for (Live& l : live) {
        const Script& s = sc[l.i];
        const bool prefill = l.step < s.chunks.size();
        const int n = prefill ? s.chunks[l.step] : 1;
        items.push_back(StepItem{l.s, &s.ids[size_t(l.pos)], n, !prefill, 1, 0});
      }
      e.step(items);
      for (size_t k = 0; k < live.size(); ++k) {
        const float* l = e.logits(int(k));
        out[live[k].i].insert(out[live[k].i].end(), l, l + V);
        live[k].pos += items[k].n;
        ++live[k].step;
      }
      for (size_t k = live.size(); k-- > 0;)
        if (live[k].pos == int(sc[live[k].i].ids.size())) {
          e.release(live[k].s);
          live.erase(live.begin() + std::ptrdiff_t(k));
        }
    }
  };
  if (alone) {
    for (size_t i = 0; i < sc.size(); ++i) {
      Engine e(m, small_engine(m, cache, 1, 8));
      drive(e, {i});
    }
  } else {
    Engine e(m, small_engine(m, cache, int(sc.size()), 8));
    std::vector<size_t> all(sc.size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = i;
    drive(e, all);
  }
  return out;
}

// 16 sequences with different prompts and positions stepping together (some prefilling in
// chunks while others decode) give each sequence exactly the logits it gets alone, at one
// and at two threads, and the same at both.
TEST(Engine, BatchedStepsAreBitwiseTheSequenceAlone) {
  const int threads = omp_get_max_threads();
  for (const Golden& g : golden_models()) {
    SCOPED_TRACE(g.name);
    const auto sc = scripts(*g.model, 16, 11);
    std::vector<std::vector<float>> first;
    for (int t : {1, 2}) {
      omp_set_num_threads(t);
      const auto together = run_scripts(*g.model, g.cache, sc, false);
      const auto alone = run_scripts(*g.model, g.cache, sc, true);
      for (size_t i = 0; i < sc.size(); ++i) {
        ASSERT_EQ(together[i].size(), alone[i].size());
        EXPECT_TRUE(together[i] == alone[i]) << "sequence " << i << " at " << t << " thread(s)";
      }
      if (first.empty()) first = alone;
      else
        for (size_t i = 0; i < sc.size(); ++i) EXPECT_TRUE(first[i] == alone[i]) << "sequence " << i << ": 1 vs 2 threads";
    }
    omp_set_num_threads(threads);
  }
}

// `dsa logits --batch-with`: the teacher-forced result does not change with company.
TEST(Engine, TeacherForcingWithCompanyIsBitwiseAlone) {
  for (const Golden& g : golden_models()) {
    SCOPED_TRACE(g.name);
    TeacherForcingOptions o;
    o.cache = g.cache;
    o.mtp = g.model->weights.mtp.has_value();
    const auto alone = run_teacher_forced(*g.model, g.ids, g.prompt_len, o);
    o.batch_with = 7;
    o.batch_seed = 3;
    const auto with = run_teacher_forced(*g.model, g.ids, g.prompt_len, o);
    EXPECT_TRUE(alone.logits == with.logits);
    EXPECT_TRUE(alone.mtp_logits == with.mtp_logits);
  }
}

// Paged (blocks of 1, 3 and 16 tokens) and contiguous (one block holding the whole
// sequence) caches give identical logits, main and MTP.
TEST(Engine, PagedAndContiguousCachesAgreeBitwise) {
  for (const Golden& g : golden_models()) {
    SCOPED_TRACE(g.name);
    TeacherForcingOptions o;
    o.cache = g.cache;
    o.mtp = g.model->weights.mtp.has_value();
    o.block_size = int(g.ids.size());
    const auto contiguous = run_teacher_forced(*g.model, g.ids, g.prompt_len, o);
    for (int bs : {1, 3, 16}) {
      o.block_size = bs;
      const auto paged = run_teacher_forced(*g.model, g.ids, g.prompt_len, o);
      EXPECT_TRUE(paged.logits == contiguous.logits) << "block size " << bs;
      EXPECT_TRUE(paged.mtp_logits == contiguous.mtp_logits) << "block size " << bs;
    }
  }
}

// A sequence whose prompt starts with cached blocks gets bitwise the logits of one that
// computes everything (prefix cache off), at its last prompt token and while decoding.
TEST(Engine, PrefixCacheHitIsBitwiseAMiss) {
  for (const Golden& g : golden_models()) {
    SCOPED_TRACE(g.name);
    const Model& m = *g.model;
    const int V = m.config.vocab_size, bs = 4;
    uint64_t x = 5;
    std::vector<int32_t> shared(22), tail(9);
    for (auto& id : shared) id = int32_t(mix(x) % uint64_t(V));
    for (auto& id : tail) id = int32_t(mix(x) % uint64_t(V));
    std::vector<int32_t> p2 = shared;
    p2.insert(p2.end(), tail.begin(), tail.end());
    auto run = [&](bool prefix_cache, int* reused) {
      EngineOptions eo = small_engine(m, g.cache, 2, bs);
      eo.max_step_tokens = 32;
      eo.prefix_cache = prefix_cache;
      Engine e(m, eo);
      const SeqId a = e.add(shared);
      const StepItem first{a, shared.data(), int(shared.size()), false, 1, 0};
      e.step(std::span<const StepItem>(&first, 1));
      e.release(a);  // its 5 full blocks stay cached
      const SeqId b = e.add(p2);
      *reused = e.reused_tokens(b);
      std::vector<float> got;
      const int prompt = 27;  // then 4 decode steps over p2's last tokens
      const StepItem pre{b, p2.data() + *reused, prompt - *reused, false, 1, 0};
      e.step(std::span<const StepItem>(&pre, 1));
      got.insert(got.end(), e.logits(0), e.logits(0) + V);
      for (int t = prompt; t < int(p2.size()); ++t) {
        const StepItem d{b, &p2[size_t(t)], 1, true, 1, 0};
        e.step(std::span<const StepItem>(&d, 1));
        got.insert(got.end(), e.logits(0), e.logits(0) + V);
      }
      EXPECT_EQ(e.prefix_stats().hits, prefix_cache ? 5 : 0);
      return got;
    };
    int hit_reused = 0, miss_reused = 0;
    const auto hit = run(true, &hit_reused);
    const auto miss = run(false, &miss_reused);
    EXPECT_EQ(hit_reused, 20);  // the 5 full blocks of the shared 22 tokens
    EXPECT_EQ(miss_reused, 0);
    EXPECT_TRUE(hit == miss);
  }
}

// A verify step's unverified draft never enters a published block; once truncated away,
// the blocks published are those whose main and MTP caches are final.
TEST(Engine, UnverifiedDraftsAreNeverPublished) {
  for (const Golden& g : golden_models()) {
    const Model& m = *g.model;
    if (!m.weights.mtp) continue;
    SCOPED_TRACE(g.name);
    const int H = m.config.hidden_size, bs = 2;
    Engine e(m, small_engine(m, g.cache, 2, bs));
    std::vector<int32_t> ids = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    for (auto& id : ids) id %= m.config.vocab_size;
    const SeqId s = e.add({}, true);
    const StepItem pre{s, ids.data(), 6, false, 1, 0};
    e.step(std::span<const StepItem>(&pre, 1));
    std::vector<float> h(e.hidden(0), e.hidden(0) + 6 * H);
    const MtpItem mp{s, ids.data() + 1, h.data(), 5, false, 0};
    e.step_mtp(std::span<const MtpItem>(&mp, 1));
    // Verify [7, draft] at positions 6, 7: block 3 is full but its last token unverified.
    const int32_t pair[2] = {ids[6], ids[7]};
    const StepItem verify{s, pair, 2, true, 2, 1};
    e.step(std::span<const StepItem>(&verify, 1));
    const MtpItem md{s, ids.data() + 6, h.data(), 1, true, 1};  // MTP position 5 (next: ids[6])
    e.step_mtp(std::span<const MtpItem>(&md, 1));
    // Published now: blocks 0 and 1 (positions 0..3; block 2 needs its MTP position 5 and
    // the token after it, both known now: published too); never block 3.
    const auto count_published = [&] {
      int n = 0;
      for (int b = 0; b < e.pool().n_blocks(); ++b) n += e.pool().published(b);
      return n;
    };
    EXPECT_EQ(count_published(), 3);
    e.truncate(s, 7);  // the draft was rejected
    EXPECT_EQ(count_published(), 3);
    e.release(s);
    EXPECT_EQ(count_published(), 3);
    // A prompt that agrees with the sequence up to the draft reuses three blocks, not four.
    std::vector<int32_t> p = ids;
    const SeqId t = e.add(p, true);
    EXPECT_EQ(e.reused_tokens(t), 6);
    e.release(t);
  }
}

// Running out of blocks is an error from the step that meets it, and the sequences stay as
// they were: releasing one makes room and the step then runs.
TEST(Engine, PoolExhaustionIsAClearErrorAndChangesNothing) {
  const auto gm = golden_models();
  ASSERT_FALSE(gm.empty());
  const Model& m = *gm.front().model;
  EngineOptions eo = small_engine(m, CacheType::F32, 3, 4);
  eo.cache_tokens = 12;  // three blocks
  Engine e(m, eo);
  std::vector<int32_t> ids(12, 1);
  const SeqId a = e.add(), b = e.add();
  const StepItem fa{a, ids.data(), 8, false, 1, 0};
  e.step(std::span<const StepItem>(&fa, 1));
  const StepItem both[2] = {{a, ids.data(), 1, true, 1, 0}, {b, ids.data(), 5, false, 1, 0}};
  try {
    e.step(both);
    FAIL() << "the step should not fit";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("exhausted"), std::string::npos) << err.what();
  }
  EXPECT_EQ(e.length(a), 8);
  EXPECT_EQ(e.length(b), 0);
  EXPECT_EQ(e.pool().free_blocks(), 1);
  e.release(a);
  e.step(std::span<const StepItem>(&both[1], 1));
  EXPECT_EQ(e.length(b), 5);
  EXPECT_THROW(e.step(std::span<const StepItem>(&both[0], 1)), Error);  // a was released
}

}  // namespace
