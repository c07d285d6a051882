#include "runtime/parallel.h"

#include <algorithm>
#include <exception>
#include <memory>
#include <optional>
#include <unordered_map>

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

  // Results in input order, each as soon as it and every earlier one are done; the first
  // failure stops the run and is thrown once the scheduler is out of it.
  std::unordered_map<const Request*, size_t> index;
  std::vector<std::optional<GenerateResult>> done(prompts.size());
  size_t next_out = 0;
  std::exception_ptr failure;
  Scheduler* self = nullptr;
  Scheduler sched(e, tok, so, [&](const Request& r, const GenerateResult& res, const std::string& error) {
    if (failure) return;
    try {
      if (!error.empty()) throw Error(error);
      done[index.at(&r)] = res;
      for (; next_out < done.size() && done[next_out]; ++next_out) {
        on_result(next_out, *done[next_out]);
        done[next_out].reset();
      }
    } catch (...) {
      failure = std::current_exception();
      self->stop();
    }
  });
  self = &sched;
  std::vector<std::shared_ptr<Request>> reqs;
  for (const std::vector<int32_t>& p : prompts) {
    auto r = std::make_shared<Request>();
    r->prompt = p;
    r->gen = g;
    r->stream = false;
    index[r.get()] = reqs.size();
    DSA_CHECK(sched.submit(r), "generate: the queue holds every prompt");
    reqs.push_back(std::move(r));
  }
  sched.run(/*until_idle=*/true);  // on this thread: the one whose OpenMP pool runs the model
  if (failure) std::rethrow_exception(failure);
}

}  // namespace dsa
