#pragma once
// vLLM's guided_choice: the reply is exactly one of a list of strings. ChoicePrefix recognizes
// the choices byte by byte as JsonSchemaPrefix does JSON texts: feed() refuses every byte with
// which no choice goes on, so a sampler masked by it never reaches a dead end, and the reply
// is closed once it is a choice that no other choice goes on from.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sampling/plain_reply.h"

namespace dsa {

class ChoiceGrammar {
public:
  static constexpr size_t kMaxChoices = 4096, kMaxBytes = 1 << 20;  // one request's bounds
  // Throws Error when there is no choice, an empty one, or more than the bounds allow.
  explicit ChoiceGrammar(std::vector<std::string> choices);
  const std::vector<std::string>& choices() const { return choices_; }  // sorted, each once

private:
  std::vector<std::string> choices_;
};

class ChoicePrefix : public PlainReply {
public:
  explicit ChoicePrefix(const ChoiceGrammar& g) : g_(&g), hi_(uint32_t(g.choices().size())) {}
  bool feed(unsigned char c);  // false: no choice goes on with c (the state is then unspecified)
  bool feed(std::string_view s);
  bool complete() const { return lo_ < hi_ && g_->choices()[lo_].size() == at_; }  // the text is a choice
  bool closed() const { return complete() && hi_ - lo_ == 1; }                      // and no other goes on from it

private:
  const ChoiceGrammar* g_;
  uint32_t lo_ = 0, hi_, at_ = 0;  // the choices [lo_, hi_) begin with the at_ bytes so far
};

}  // namespace dsa
