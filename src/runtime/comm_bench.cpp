#include "runtime/comm_bench.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "runtime/dist.h"

namespace dsa {

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::AllReduce: return "allreduce";
    case Collective::AllGather: return "allgather";
    case Collective::Send: return "send";
    case Collective::Broadcast: return "broadcast";
    case Collective::AllToAll: return "alltoall";
  }
  return "?";
}

Collective parse_collective(const std::string& s) {
  for (Collective c : {Collective::AllReduce, Collective::AllGather, Collective::Send, Collective::Broadcast, Collective::AllToAll})
    if (s == collective_name(c)) return c;
  throw Error("--collective '" + s + "': expected allreduce (--ep), allgather (--tp), send (--pp), broadcast (--pp's logits) or alltoall (--ep --dp)");
}

namespace {

// One timed run of the collective over buf (count floats; part: this rank's share for the
// all-gather, what arrives for the all-to-all). to_each / from_each: the rows this rank
// sends each rank and receives from each in the all-to-all (its tokens split evenly, as
// balanced routing would: rank r gets the r-th share of every rank's tokens).
void run_once(Collective c, std::vector<float>& buf, std::vector<float>& part, int rows, int hidden, const std::vector<int>& to_each,
              const std::vector<int>& from_each) {
  const size_t count = buf.size();
  const int r = dist::rank(), n = dist::size();
  switch (c) {
    case Collective::AllReduce:
      dist::sum(buf.data(), count);
      std::fill(buf.begin(), buf.end(), 1.0f);  // no overflow to inf over the repeats
      break;
    case Collective::AllGather:
      dist::gather_columns(part.data(), rows, hidden, buf.data());
      break;
    case Collective::Send:
      if (r % 2 == 0 && r + 1 < n) dist::send(buf.data(), count * sizeof(float), r + 1);
      else if (r % 2 == 1) dist::recv(buf.data(), count * sizeof(float), r - 1);
      break;
    case Collective::Broadcast:
      dist::broadcast(buf.data(), count, 0);
      break;
    case Collective::AllToAll:
      dist::exchange_rows(buf.data(), to_each.data(), from_each.data(), hidden, part.data());
      break;
  }
}

}  // namespace

std::vector<CommPoint> measure_collective(Collective c, int hidden, const std::vector<int>& tokens, int repeat) {
  const int ranks = dist::size();
  if (c == Collective::AllGather && hidden % ranks != 0)
    throw Error("--hidden " + std::to_string(hidden) + ": an all-gather needs a multiple of the " + std::to_string(ranks) + " ranks");
  std::vector<CommPoint> out;
  std::vector<float> buf, part;
  std::vector<double> t(size_t(std::max(repeat, 1)));
  for (int n : tokens) {
    const size_t count = size_t(n) * size_t(hidden);
    buf.assign(count, 1.0f);
    std::vector<int> to_each(static_cast<size_t>(ranks)), from_each(static_cast<size_t>(ranks));
    for (int r = 0; r < ranks; ++r) to_each[size_t(r)] = n / ranks + (r < n % ranks ? 1 : 0);
    std::fill(from_each.begin(), from_each.end(), to_each[size_t(dist::rank())]);
    part.assign(c == Collective::AllToAll ? size_t(ranks) * size_t(from_each[0]) * size_t(hidden) : count / size_t(ranks), 1.0f);
    for (int w = 0; w < 3; ++w) run_once(c, buf, part, n, hidden, to_each, from_each);  // connections set up, pages touched
    for (double& s : t) {
      dist::barrier();
      const auto t0 = std::chrono::steady_clock::now();
      run_once(c, buf, part, n, hidden, to_each, from_each);
      s = dist::max_over_ranks(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(t.begin(), t.end());
    CommPoint p;
    p.tokens = n;
    p.bytes = count * sizeof(float);
    p.median_us = t[t.size() / 2] * 1e6;
    p.p90_us = t[std::min(t.size() - 1, t.size() * 9 / 10)] * 1e6;
    p.algbw_gbps = double(p.bytes) / (p.median_us * 1e-6) / 1e9;
    const double k = double(ranks - 1) / double(ranks);
    p.busbw_gbps = p.algbw_gbps * (c == Collective::AllReduce ? 2.0 * k : c == Collective::AllGather || c == Collective::AllToAll ? k : 1.0);
    out.push_back(p);
  }
  return out;
}

}  // namespace dsa
