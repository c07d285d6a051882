// An engine driven from rank 0 of an MPI job: the leader sends each mutating call (its
// arguments, flattened) to every rank before running it; the followers run the same call on
// their engines, so that every rank's block tables, prefix cache and forward steps stay the
// same as the leader's and the step's collectives meet. A call that fails on the leader
// fails alike on the followers (same state, same arguments), which go on to the next.
#include <cstring>

#include "core/error.h"
#include "runtime/dist.h"
#include "runtime/engine.h"

namespace dsa {
namespace {

template <class T>
void put(std::vector<uint8_t>& w, const T* p, size_t n) {
  const size_t at = w.size();
  w.resize(at + n * sizeof(T));
  if (n) std::memcpy(w.data() + at, p, n * sizeof(T));
}
template <class T>
void put(std::vector<uint8_t>& w, T v) {
  put(w, &v, 1);
}

// Reads what put wrote, in order; a short wire is a broken job, not bad input.
struct Reader {
  const uint8_t* p;
  const uint8_t* end;
  template <class T>
  T get() {
    T v;
    take(&v, 1);
    return v;
  }
  template <class T>
  void take(T* out, size_t n) {
    DSA_CHECK(size_t(end - p) >= n * sizeof(T), "engine follower: a truncated call from the leader");
    std::memcpy(out, p, n * sizeof(T));
    p += n * sizeof(T);
  }
};

}  // namespace

void Engine::lead() { leading_ = dist::active() && dist::rank() == 0; }

void Engine::stop_followers() {
  if (!leading_) return;
  wire_.clear();
  send_wire(kCallStop);
  leading_ = false;
}

void Engine::send_wire(int call) {
  int64_t head[2] = {call, int64_t(wire_.size())};
  dist::broadcast_bytes_idle(head, sizeof head, 0);
  if (!wire_.empty()) dist::broadcast_bytes(wire_.data(), wire_.size(), 0);
}

void Engine::announce_add(std::span<const int32_t> prompt, bool mtp) {
  wire_.clear();
  put(wire_, uint8_t(mtp));
  put(wire_, prompt.data(), prompt.size());
  send_wire(kCallAdd);
}

void Engine::announce_seq(int call, SeqId s, int n) {
  wire_.clear();
  put(wire_, s);
  put(wire_, n);
  send_wire(call);
}

void Engine::announce_step(std::span<const StepItem> items) {
  wire_.clear();
  put(wire_, int32_t(items.size()));
  for (const StepItem& it : items) {
    put(wire_, it.seq);
    put(wire_, int32_t(it.n));
    put(wire_, uint8_t(it.decode));
    put(wire_, int32_t(it.logits));
    put(wire_, int32_t(it.unverified));
    const bool data = it.n > 0 && it.ids;
    put(wire_, uint8_t(data));
    if (data) put(wire_, it.ids, size_t(it.n));
  }
  send_wire(kCallStep);
}

void Engine::announce_mtp(std::span<const MtpItem> items) {
  const size_t H = size_t(m_.config.hidden_size);
  wire_.clear();
  put(wire_, int32_t(items.size()));
  for (const MtpItem& it : items) {
    put(wire_, it.seq);
    put(wire_, int32_t(it.n));
    put(wire_, uint8_t(it.decode));
    put(wire_, int32_t(it.logits));
    const bool data = it.n > 0 && it.next && it.h;
    put(wire_, uint8_t(data));
    if (data) {
      put(wire_, it.next, size_t(it.n));
      put(wire_, it.h, size_t(it.n) * H);
    }
  }
  send_wire(kCallMtp);
}

bool Engine::replay() {
  int64_t head[2] = {0, 0};
  dist::broadcast_bytes_idle(head, sizeof head, 0);
  wire_.resize(size_t(head[1]));
  if (head[1] > 0) dist::broadcast_bytes(wire_.data(), wire_.size(), 0);
  Reader r{wire_.data(), wire_.data() + wire_.size()};
  const size_t H = size_t(m_.config.hidden_size);
  switch (int(head[0])) {
    case kCallStop:
      return false;
    case kCallAdd: {
      const bool mtp = r.get<uint8_t>() != 0;
      std::vector<int32_t> prompt(size_t(r.end - r.p) / sizeof(int32_t));
      r.take(prompt.data(), prompt.size());
      add(prompt, mtp);
      return true;
    }
    case kCallRelease:
    case kCallTruncate: {
      const SeqId s = r.get<SeqId>();
      const int n = r.get<int32_t>();
      if (head[0] == kCallRelease) release(s);
      else truncate(s, n);
      return true;
    }
    case kCallStep:
    case kCallMtp: {
      const int n_items = r.get<int32_t>();
      std::vector<std::vector<int32_t>> ids(static_cast<size_t>(n_items));
      std::vector<std::vector<float>> h(static_cast<size_t>(n_items));
      std::vector<StepItem> steps(static_cast<size_t>(n_items));
      std::vector<MtpItem> mtps(static_cast<size_t>(n_items));
      for (int i = 0; i < n_items; ++i) {
        const SeqId s = r.get<SeqId>();
        const int n = r.get<int32_t>();
        const bool decode = r.get<uint8_t>() != 0;
        const int logits = r.get<int32_t>();
        const int unverified = head[0] == kCallStep ? r.get<int32_t>() : 0;
        const bool data = r.get<uint8_t>() != 0;
        ids[size_t(i)].resize(data ? size_t(n) : 0);
        r.take(ids[size_t(i)].data(), ids[size_t(i)].size());
        if (head[0] == kCallMtp && data) {
          h[size_t(i)].resize(size_t(n) * H);
          r.take(h[size_t(i)].data(), h[size_t(i)].size());
        }
        const int32_t* p = data ? ids[size_t(i)].data() : nullptr;
        steps[size_t(i)] = StepItem{s, p, n, decode, logits, unverified};
        mtps[size_t(i)] = MtpItem{s, p, data && head[0] == kCallMtp ? h[size_t(i)].data() : nullptr, n, decode, logits};
      }
      if (head[0] == kCallStep) step(steps);
      else step_mtp(mtps);
      return true;
    }
    default:
      DSA_CHECK(false, "engine follower: an unknown call from the leader");
  }
  return false;
}

void Engine::follow() {
  if (!dist::active() || dist::rank() == 0) return;
  for (;;) {
    try {
      if (!replay()) return;
    } catch (const Error&) {
      // The leader's same call failed the same way and it reports it; state is unchanged.
    }
  }
}

}  // namespace dsa
