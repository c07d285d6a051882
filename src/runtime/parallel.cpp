#include "runtime/parallel.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>

#include "core/error.h"

namespace dsa {

namespace {

struct Running {
  size_t index = 0;
  SeqId seq = -1;
  int pos = 0;          // prompt tokens in the cache
  int32_t next = -1;    // sampled, not yet fed (decoding)
  int step_n = 0;       // tokens in the current step
  int item = -1;        // its item in the current step
  int blocks_max = 0;   // blocks the sequence can grow to
  std::unique_ptr<Completion> comp;
  std::chrono::steady_clock::time_point t0;
};

int blocks_for(int64_t tokens, int bs) { return int((tokens + bs - 1) / bs); }

}  // namespace

void generate_parallel(Engine& e, const Tokenizer* tok, const std::vector<std::vector<int32_t>>& prompts, const GenerateOptions& g,
                       const ParallelOptions& o, const std::function<void(size_t, GenerateResult&)>& on_result) {
  const EngineOptions& eo = e.options();
  const int K = std::min(o.parallel > 0 ? o.parallel : int(prompts.size()), eo.max_seqs);
  const int chunk = std::min(o.prefill_chunk, eo.max_step_tokens);
  if (chunk < 1) throw Error("generate: prefill chunk must be positive");
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].empty()) throw Error("prompt " + std::to_string(i + 1) + " is empty");
    if (int64_t(prompts[i].size()) > eo.max_ctx)
      throw Error("prompt " + std::to_string(i + 1) + " of " + std::to_string(prompts[i].size()) + " tokens exceeds the context size " +
                  std::to_string(eo.max_ctx));
  }
  const std::vector<int32_t> banned = undecodable_ids(e.model(), tok);
  std::vector<std::optional<GenerateResult>> done(prompts.size());
  size_t next_out = 0, next_in = 0;
  std::vector<Running> run;
  run.reserve(size_t(K));
  std::vector<StepItem> items;
  items.reserve(size_t(K));
  const int bs = eo.block_size;

  auto finish = [&](Running& r) {
    r.comp->finish();
    GenerateResult& res = r.comp->result();
    res.decode_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - r.t0).count() - res.prefill_s;
    e.release(r.seq);
    done[r.index] = std::move(res);
    while (next_out < done.size() && done[next_out]) {
      on_result(next_out, *done[next_out]);
      done[next_out].reset();
      ++next_out;
    }
  };
  // Blocks the running sequences may still take: admission keeps that much free.
  auto promised = [&] {
    int b = 0;
    for (const Running& r : run) b += r.blocks_max - blocks_for(e.length(r.seq), bs);
    return b;
  };
  while (next_out < prompts.size()) {
    while (int(run.size()) < K && next_in < prompts.size()) {
      const std::vector<int32_t>& p = prompts[next_in];
      const int total = int(std::min<int64_t>(int64_t(p.size()) + std::max(g.max_new_tokens, 1), eo.max_ctx));
      const int need = blocks_for(total, bs);
      if (!run.empty() && e.pool().free_blocks() - promised() < need) break;  // wait for room
      Running r;
      r.index = next_in++;
      r.seq = e.add(p);
      r.pos = e.length(r.seq);
      r.blocks_max = need;
      r.comp = std::make_unique<Completion>(e.model(), tok, p, g, banned);
      r.comp->result().reused_tokens = r.pos;
      r.t0 = std::chrono::steady_clock::now();
      run.push_back(std::move(r));
    }
    // One token of every decoding sequence; then prefill chunks while the budget lasts.
    items.clear();
    int budget = eo.max_step_tokens;
    for (Running& r : run) {
      r.step_n = 0;
      if (r.next < 0) continue;
      r.item = int(items.size());
      items.push_back(StepItem{r.seq, &r.next, 1, true, 1, 0});
      r.step_n = 1;
      --budget;
    }
    for (Running& r : run) {
      if (r.next >= 0) continue;
      const int n = std::min(chunk, int(prompts[r.index].size()) - r.pos);
      if (n > budget) break;  // keep the prompt's chunking fixed: wait for the next step
      r.item = int(items.size());
      items.push_back(StepItem{r.seq, &prompts[r.index][size_t(r.pos)], n, false, r.pos + n == int(prompts[r.index].size()) ? 1 : 0, 0});
      r.step_n = n;
      budget -= n;
    }
    DSA_CHECK(!items.empty(), "generate: a step with nothing to run");
    e.step(items);
    for (size_t i = 0; i < run.size();) {
      Running& r = run[i];
      if (r.step_n == 0) { ++i; continue; }
      const float* logits = r.pos + r.step_n == int(prompts[r.index].size()) || r.next >= 0 ? e.logits(r.item) : nullptr;
      bool stop = false;
      if (r.next < 0) {
        r.pos += r.step_n;
        if (r.pos < int(prompts[r.index].size())) { ++i; continue; }
        GenerateResult& res = r.comp->result();
        res.prefill_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - r.t0).count();
        if (g.max_new_tokens == 0) stop = true;
      } else {
        ++r.comp->result().decode_steps;
      }
      if (!stop) {
        r.next = r.comp->sampler().sample(logits);
        stop = r.comp->emit(r.next, e.length(r.seq) >= eo.max_ctx);
      }
      if (stop) {
        finish(r);
        run.erase(run.begin() + std::ptrdiff_t(i));
      } else {
        ++i;
      }
    }
  }
}

}  // namespace dsa
