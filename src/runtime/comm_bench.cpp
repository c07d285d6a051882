#include "runtime/comm_bench.h"

#include <algorithm>
#include <chrono>

#include "runtime/dist.h"

namespace dsa {

std::vector<CommPoint> measure_allreduce(int hidden, const std::vector<int>& tokens, int repeat) {
  std::vector<CommPoint> out;
  const int ranks = dist::size();
  std::vector<float> buf;
  std::vector<double> t(size_t(std::max(repeat, 1)));
  for (int n : tokens) {
    const size_t count = size_t(n) * size_t(hidden);
    buf.assign(count, 1.0f);
    for (int w = 0; w < 3; ++w) dist::sum(buf.data(), count);  // connections set up, pages touched
    for (double& s : t) {
      dist::barrier();
      const auto t0 = std::chrono::steady_clock::now();
      dist::sum(buf.data(), count);
      s = dist::max_over_ranks(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      std::fill(buf.begin(), buf.end(), 1.0f);  // no overflow to inf over the repeats
    }
    std::sort(t.begin(), t.end());
    CommPoint p;
    p.tokens = n;
    p.bytes = count * sizeof(float);
    p.median_us = t[t.size() / 2] * 1e6;
    p.p90_us = t[std::min(t.size() - 1, t.size() * 9 / 10)] * 1e6;
    p.algbw_gbps = double(p.bytes) / (p.median_us * 1e-6) / 1e9;
    p.busbw_gbps = p.algbw_gbps * 2.0 * double(ranks - 1) / double(ranks);
    out.push_back(p);
  }
  return out;
}

}  // namespace dsa
