#pragma once
// Stop strings on streamed text. Text arrives in arbitrary chunks (one token's worth at a
// time), so a stop string may straddle chunks: the matcher holds back the longest tail
// that could still be the start of a stop string and releases it once it cannot. The
// stop string itself and everything after it are never emitted (OpenAI semantics).
#include <string>
#include <string_view>
#include <vector>

namespace dsa {

class StopMatcher {
public:
  explicit StopMatcher(std::vector<std::string> stops = {});

  // Appends to `out` the text that is now safe to show. After a stop string has been
  // seen, stopped() is true and further input is ignored.
  void push(std::string_view text, std::string& out);
  // End of stream: releases the held-back tail (it did not turn into a stop string).
  void flush(std::string& out);
  void reset();

  bool stopped() const { return stopped_; }
  const std::string& matched() const { return matched_; }  // the stop string that fired
  bool empty() const { return stops_.empty(); }

private:
  std::vector<std::string> stops_;
  std::string buf_;  // held-back tail; reserved once, at most max_len - 1 bytes between calls
  std::string matched_;
  bool stopped_ = false;
};

}  // namespace dsa
