#pragma once
// One generation request's life on its HTTP thread: its choices queued with the scheduler,
// their output gathered as it arrives and written as OpenAI objects, whole (chat.completion,
// text_completion) or as server-sent-event chunks.
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/scheduler.h"
#include "server/protocol.h"
#include "server/reply.h"

namespace dsa::server {

class Exchange {
public:
  Exchange(const Job& job, const ModelInfo& model, const std::string& id);
  ~Exchange();  // cancels what is still running (a client gone)

  // Queues every choice; false when the queue is full (nothing stays queued then).
  bool submit(Scheduler& s);
  void cancel();
  // Waits up to `timeout` for output; each arrival goes through the choice's parser.
  // Returns false when nothing arrived.
  bool poll(std::chrono::milliseconds timeout);
  bool done() const;
  std::string error() const;  // the first failed choice's error, or ""

  nlohmann::json response() const;  // the whole reply object (non-streaming)
  std::string take_chunks();        // SSE events for what arrived since the last call
  std::string final_chunks();       // the usage chunk when asked, then [DONE]

private:
  struct Choice {
    int index = 0, prompt = 0;
    std::shared_ptr<Request> req;
    std::unique_ptr<ReplyStream> reply;  // chat
    std::string text;                    // completions: all text so far
    std::vector<TokenOut> tokens;        // all tokens so far
    std::vector<TokenOut> prompt_lp;     // echo with logprobs: prompt tokens 1, 2, ... so far
    bool started = false, done = false, finish_sent = false;
    GenerateResult result;
    std::string error;
    // Since the last take_chunks():
    ReplyDelta delta;
    std::string new_text;
    size_t tokens_sent = 0, prompt_sent = 0, offset_sent = 0;
  };
  const Job& job_;
  const ModelInfo& model_;
  std::string id_;
  int64_t created_;
  std::vector<Choice> choices_;
  bool submitted_ = false;

  void absorb(Choice& c, Request::Output& out);
  std::string finish_reason(const Choice& c) const;
  nlohmann::json stop_reason(const Choice& c) const;
  nlohmann::json chunk(const nlohmann::json& choice) const;
  nlohmann::json logprobs_chat(const Choice& c, size_t from) const;
  bool prompt_logprobs() const { return !job_.chat && job_.echo && job_.logprobs >= 0; }
  // The prompt entries of c's logprobs so far: its first token and those delivered.
  size_t prompt_entries(const Choice& c) const { return prompt_logprobs() ? 1 + c.prompt_lp.size() : 0; }
  // The legacy completions' logprobs object over prompt entries [p_from, ..) (entry 0 the
  // prompt's first token, which has none; then c.prompt_lp) and generated tokens [from, ..),
  // text offsets counted from `offset`, which is left past them.
  nlohmann::json logprobs_completion(const Choice& c, size_t p_from, size_t p_to, size_t from, size_t& offset) const;
  nlohmann::json usage() const;
  nlohmann::json message(const Choice& c) const;
  std::string token_text(int32_t id) const;
};

}  // namespace dsa::server
