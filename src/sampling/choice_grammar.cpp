#include "sampling/choice_grammar.h"

#include <algorithm>

#include "core/error.h"

namespace dsa {

ChoiceGrammar::ChoiceGrammar(std::vector<std::string> choices) : choices_(std::move(choices)) {
  if (choices_.empty()) throw Error("guided_choice: expected at least one choice");
  if (choices_.size() > kMaxChoices) throw Error("guided_choice: more than " + std::to_string(kMaxChoices) + " choices");
  size_t bytes = 0;
  for (const std::string& c : choices_) {
    if (c.empty()) throw Error("guided_choice: a choice is empty");
    bytes += c.size();
  }
  if (bytes > kMaxBytes) throw Error("guided_choice: the choices hold more than " + std::to_string(kMaxBytes) + " bytes");
  std::sort(choices_.begin(), choices_.end());
  choices_.erase(std::unique(choices_.begin(), choices_.end()), choices_.end());
}

// Among the sorted choices [lo_, hi_) that share their first at_ bytes, those that end there
// sort first and the rest by their next byte: the ones going on with c are a run, found by
// binary search.
bool ChoicePrefix::feed(unsigned char c) {
  const std::vector<std::string>& ch = g_->choices();
  auto next = [&](const std::string& s) { return s.size() > at_ ? int(static_cast<unsigned char>(s[at_])) : -1; };
  const auto b = ch.begin();
  const auto lo = std::partition_point(b + lo_, b + hi_, [&](const std::string& s) { return next(s) < int(c); });
  const auto hi = std::partition_point(lo, b + hi_, [&](const std::string& s) { return next(s) == int(c); });
  if (lo == hi) return false;
  lo_ = uint32_t(lo - b), hi_ = uint32_t(hi - b), ++at_;
  return true;
}

bool ChoicePrefix::feed(std::string_view s) {
  for (char c : s)
    if (!feed(static_cast<unsigned char>(c))) return false;
  return true;
}

}  // namespace dsa
