#include "runtime/parallel.h"

#include <algorithm>
#include <memory>

#include "core/error.h"
#include "runtime/scheduler.h"

namespace dsa {

void generate_parallel(Engine& e, const Tokenizer* tok, const std::vector<std::vector<int32_t>>& prompts, const GenerateOptions& g,
                       const ParallelOptions& o, const std::function<void(size_t, GenerateResult&)>& on_result) {
  const EngineOptions& eo = e.options();
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].empty()) throw Error("prompt " + std::to_string(i + 1) + " is empty");
    if (int64_t(prompts[i].size()) > eo.max_ctx)
      throw Error("prompt " + std::to_string(i + 1) + " of " + std::to_string(prompts[i].size()) +
                  " tokens exceeds the context size " + std::to_string(eo.max_ctx));
  }
  if (o.prefill_chunk < 1) throw Error("generate: prefill chunk must be positive");
  SchedulerOptions so;
  so.max_seqs = std::min(o.parallel > 0 ? o.parallel : int(prompts.size()), eo.max_seqs);
  so.prefill_chunk = std::min(o.prefill_chunk, eo.max_step_tokens);
  so.max_waiting = int(prompts.size());
  Scheduler sched(e, tok, so);
  std::vector<std::shared_ptr<Request>> reqs;
  for (const std::vector<int32_t>& p : prompts) {
    auto r = std::make_shared<Request>();
    r->prompt = p;
    r->gen = g;
    DSA_CHECK(sched.submit(r), "generate: the queue holds every prompt");
    reqs.push_back(std::move(r));
  }
  // Results in input order, each as soon as it and every earlier one are done.
  for (size_t i = 0; i < reqs.size(); ++i) {
    Request::Output out;
    while (!reqs[i]->take(out, std::chrono::seconds(1)) || !out.done) {
    }
    if (!out.error.empty()) throw Error(out.error);
    on_result(i, out.result);
  }
}

}  // namespace dsa
