#include "sampling/stop.h"

#include <algorithm>

#include "core/error.h"

namespace dsa {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  size_t mx = 0;
  for (const auto& s : stops_) {
    if (s.empty()) throw Error("stop strings must not be empty");
    mx = std::max(mx, s.size());
  }
  buf_.reserve(mx + 256);
}

void StopMatcher::reset() {
  buf_.clear();
  matched_.clear();
  stopped_ = false;
}

void StopMatcher::push(std::string_view text, std::string& out) {
  if (stopped_) return;
  if (stops_.empty()) {
    out.append(text);
    return;
  }
  buf_.append(text);
  // The earliest complete stop string wins (the longest one on a tie at the same place).
  size_t best = std::string::npos;
  const std::string* which = nullptr;
  for (const auto& s : stops_) {
    const size_t at = buf_.find(s);
    if (at != std::string::npos && (at < best || (at == best && s.size() > which->size()))) {
      best = at;
      which = &s;
    }
  }
  if (which) {
    out.append(buf_, 0, best);
    matched_ = *which;
    stopped_ = true;
    buf_.clear();
    return;
  }
  // Hold back the longest suffix of buf_ that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const auto& s : stops_) {
    for (size_t k = std::min(s.size() - 1, buf_.size()); k > hold; --k)
      if (std::string_view(buf_).substr(buf_.size() - k) == std::string_view(s).substr(0, k)) {
        hold = k;
        break;
      }
  }
  out.append(buf_, 0, buf_.size() - hold);
  buf_.erase(0, buf_.size() - hold);
}

void StopMatcher::flush(std::string& out) {
  if (!stopped_) out.append(buf_);
  buf_.clear();
}

}  // namespace dsa
