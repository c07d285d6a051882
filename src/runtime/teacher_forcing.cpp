#include "runtime/teacher_forcing.h"

#include <algorithm>
#include <limits>
#include <optional>

#include "core/error.h"
#include "runtime/engine.h"

namespace dsa {

namespace {

// Sequences that share the teacher-forced sequence's steps: random ids, random prompt and
// total lengths, prefilling in random chunks and then decoding (teacher-forced on their own
// random ids); each one done is replaced by a fresh one.
class Companions {
public:
  static constexpr int kMaxChunk = 16, kMaxLen = 96;
  Companions(Engine& e, int count, uint64_t seed) : e_(e), x_(seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull) {
    seqs_.resize(size_t(count));
    for (auto& c : seqs_) start(c);
  }
  ~Companions() {
    for (auto& c : seqs_) e_.release(c.s);
  }
  // Appends this step's items: a prefill chunk of random size for those still prefilling,
  // one decode token for the others (the engine orders them by role).
  void add_items(std::vector<StepItem>& items) {
    for (auto& c : seqs_) {
      StepItem it;
      it.seq = c.s;
      it.ids = &c.ids[size_t(c.done)];
      if (c.done < c.prompt) {
        it.n = std::min(int(next() % kMaxChunk) + 1, c.prompt - c.done);
        it.logits = int(next() % 2);
      } else {
        it.n = 1;
        it.decode = true;
      }
      c.step_n = it.n;
      items.push_back(it);
    }
  }
  void advance() {
    for (auto& c : seqs_) {
      c.done += c.step_n;
      if (c.done == int(c.ids.size())) {
        e_.release(c.s);
        start(c);
      }
    }
  }

private:
  struct Seq {
    SeqId s = -1;
    std::vector<int32_t> ids;
    int prompt = 0, done = 0, step_n = 0;
  };
  Engine& e_;
  uint64_t x_;
  std::vector<Seq> seqs_;
  uint64_t next() {
    x_ ^= x_ >> 12; x_ ^= x_ << 25; x_ ^= x_ >> 27;
    return x_ * 0x2545f4914f6cdd1dull;
  }
  void start(Seq& c) {
    const int total = 2 + int(next() % (kMaxLen - 1));
    c.ids.resize(size_t(total));
    for (auto& id : c.ids) id = int32_t(next() % uint64_t(e_.model().config.vocab_size));
    c.prompt = 1 + int(next() % uint64_t(total - 1));
    c.done = 0;
    c.s = e_.add();
  }
};

EngineOptions engine_options(int T, int N, const TeacherForcingOptions& o) {
  EngineOptions eo;
  eo.cache = o.cache;
  eo.block_size = o.block_size;
  eo.max_ctx = std::max(T, o.batch_with > 0 ? Companions::kMaxLen : 1);
  eo.max_seqs = 1 + o.batch_with;
  eo.max_step_tokens = N + o.batch_with * Companions::kMaxChunk;
  eo.max_logit_rows = N + o.batch_with;
  const int64_t bs = o.block_size;
  const int64_t blocks = (T + bs - 1) / bs + int64_t(o.batch_with) * ((Companions::kMaxLen + bs - 1) / bs);
  eo.cache_tokens = blocks * bs;
  eo.mtp = o.mtp;
  eo.prefix_cache = false;
  return eo;
}

// Rows collected by the tap into the golden layout [rows, width].
void collect(const std::map<std::string, std::map<int, std::vector<float>>>& frows,
             const std::map<std::string, std::map<int, std::vector<int32_t>>>& irows, TeacherForcedResult& r) {
  for (auto& [name, rows] : frows) {
    const int64_t nrows = int64_t(rows.size());
    size_t width = 0;
    for (auto& [p, row] : rows) width = std::max(width, row.size());
    // Score rows cover keys 0..pos; the rest of a causal row is -inf, as in the goldens.
    if (name.rfind("indexer.scores.", 0) == 0) width = size_t(nrows);
    auto& f = r.floats[name];
    f.shape = {nrows, int64_t(width)};
    f.v.assign(size_t(nrows) * width, -std::numeric_limits<float>::infinity());
    for (auto& [p, row] : rows) std::copy(row.begin(), row.end(), &f.v[size_t(p) * width]);
  }
  for (auto& [name, rows] : irows) {
    const size_t width = rows.begin()->second.size();
    auto& iv = r.ints[name];
    iv.shape = {int64_t(rows.size()), int64_t(width)};
    iv.v.assign(rows.size() * width, -1);
    for (auto& [p, row] : rows) std::copy(row.begin(), row.end(), &iv.v[size_t(p) * width]);
  }
}

}  // namespace

TeacherForcedResult run_teacher_forced(const Model& m, const std::vector<int32_t>& ids, int prompt_len, const TeacherForcingOptions& o) {
  const ModelConfig& c = m.config;
  const int T = int(ids.size()), N = prompt_len, V = c.vocab_size, H = c.hidden_size;
  if (N < 1 || N > T) throw Error("prompt length " + std::to_string(N) + " outside 1.." + std::to_string(T));
  if (o.mtp && !m.weights.mtp) throw Error("the model has no MTP layer loaded (num_nextn_predict_layers = 0)");
  if (o.batch_with < 0) throw Error("--batch-with must be >= 0");
  if (o.internals && o.batch_with > 0) throw Error("internals are recorded for one sequence alone, not with --batch-with");

  Engine e(m, engine_options(T, N, o));
  std::map<std::string, std::map<int, std::vector<float>>> frows;
  std::map<std::string, std::map<int, std::vector<int32_t>>> irows;
  Tap tap;
  tap.floats = [&](const std::string& n, int pos, const float* v, int k) { frows[n][pos].assign(v, v + k); };
  tap.ints = [&](const std::string& n, int pos, const int32_t* v, int k) { irows[n][pos].assign(v, v + k); };
  if (o.internals) e.set_tap(&tap);

  TeacherForcedResult r;
  r.T = T;
  r.vocab = V;
  r.logits.resize(size_t(T) * size_t(V));
  if (o.mtp) r.mtp_logits.resize(size_t(T - 1) * size_t(V));
  const SeqId s = e.add({}, o.mtp);
  std::optional<Companions> others;
  if (o.batch_with > 0) others.emplace(e, o.batch_with, o.batch_seed);
  std::vector<StepItem> items;
  items.reserve(size_t(1 + o.batch_with));
  // One step: the teacher-forced item (item 0) and the companions' items.
  auto step = [&](const StepItem& mine) {
    items.clear();
    items.push_back(mine);
    if (others) others->add_items(items);
    e.step(items);
    if (others) others->advance();
  };
  auto run_mtp = [&](const float* h, const int32_t* next, int n, int row0, bool decode) {
    if (!o.mtp || n <= 0) return;
    const MtpItem mi{s, next, h, n, decode, n};
    e.step_mtp(std::span<const MtpItem>(&mi, 1));
    std::copy_n(e.logits(0), size_t(n) * size_t(V), &r.mtp_logits[size_t(row0) * size_t(V)]);
  };

  step(StepItem{s, ids.data(), N, false, N, 0});
  std::copy_n(e.logits(0), size_t(N) * size_t(V), r.logits.data());
  std::vector<float> h_prompt(e.hidden(0), e.hidden(0) + size_t(N) * size_t(H));
  std::vector<float> h_last(h_prompt.end() - H, h_prompt.end()), h_now(static_cast<size_t>(H));
  // MTP row i predicts token i+2 from the final-normed h[i] and ids[i+1]: rows 0..N-2
  // come with the prefill.
  run_mtp(h_prompt.data(), &ids[1], N - 1, 0, false);
  for (int t = N; t < T; ++t) {
    step(StepItem{s, &ids[size_t(t)], 1, true, 1, 0});
    std::copy_n(e.logits(0), size_t(V), &r.logits[size_t(t) * size_t(V)]);
    std::copy_n(e.hidden(0), size_t(H), h_now.begin());
    // MTP position t-1 needs h[t-1] (kept from the previous step) and ids[t].
    run_mtp(h_last.data(), &ids[size_t(t)], 1, t - 1, true);
    std::swap(h_last, h_now);
  }
  e.release(s);
  collect(frows, irows, r);
  return r;
}

}  // namespace dsa
