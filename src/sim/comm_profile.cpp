#include "sim/comm_profile.h"

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/mmap_file.h"

namespace dsa::sim {

CommMeasurement load_comm_measurement(const std::string& path) {
  const std::string text = read_text_file(path, "communication measurements", size_t(16) << 20);
  const auto j = nlohmann::json::parse(text, nullptr, false);
  const std::string what = "--comm " + path + ": ";
  if (j.is_discarded() || !j.is_object()) throw Error(what + "not JSON (expected the output of mpirun -np N dsa bench comm --json)");
  if (j.value("collective", "") != "allreduce") throw Error(what + "expected \"collective\": \"allreduce\" (dsa bench comm --json)");
  CommMeasurement m;
  const auto count = [&](const char* key) {
    if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<int64_t>() < 1 || j[key].get<int64_t>() > (1 << 20))
      throw Error(what + "\"" + key + "\" must be a positive integer");
    return int(j[key].get<int64_t>());
  };
  m.ranks = count("ranks");
  m.nodes = count("nodes");
  if (m.ranks < 2 || m.nodes > m.ranks) throw Error(what + "needs at least 2 ranks, on at most as many nodes");
  if (!j.contains("points") || !j["points"].is_array() || j["points"].size() < 2)
    throw Error(what + "\"points\" must list at least two sizes");
  for (const auto& p : j["points"]) {
    const double b = p.is_object() && p.contains("bytes") && p["bytes"].is_number() ? p["bytes"].get<double>() : -1;
    const double t = p.is_object() && p.contains("median_us") && p["median_us"].is_number() ? p["median_us"].get<double>() : -1;
    if (!(b > 0 && std::isfinite(b) && t > 0 && std::isfinite(t))) throw Error(what + "every point needs positive \"bytes\" and \"median_us\"");
    m.bytes.push_back(b);
    m.median_us.push_back(t);
  }
  return m;
}

std::string calibrate_links(Hardware& hw, const CommMeasurement& m) {
  const double n = m.ranks, hops = 2.0 * (n - 1.0), share = 2.0 * (n - 1.0) / n;
  // Least squares of t on moved bytes: slope = us per byte, intercept = hops * latency.
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  const double k = double(m.bytes.size());
  for (size_t i = 0; i < m.bytes.size(); ++i) {
    const double x = share * m.bytes[i], y = m.median_us[i];
    sx += x, sy += y, sxx += x * x, sxy += x * y;
  }
  const double den = k * sxx - sx * sx;
  const double slope = den > 0 ? (k * sxy - sx * sy) / den : 0;
  if (!(slope > 0)) throw Error("--comm: the measured times do not grow with the message size; measure more sizes (--tokens)");
  const double latency_us = std::max(0.0, (sy - slope * sx) / k) / hops;
  const double gbps = 1e-3 / slope;  // bytes per us -> GB/s
  const bool inter = m.nodes > 1;
  if (inter) {
    hw.inter_node_bandwidth_gbps = gbps;
    hw.inter_node_latency_us = latency_us;
    hw.devices_per_node = std::max(1, m.ranks / m.nodes);
  } else {
    hw.intra_node_bandwidth_gbps = gbps;
    hw.intra_node_latency_us = latency_us;
    if (hw.name == "local" && hw.devices_per_node == 1 && m.ranks > 1) {
      // The ranks share this machine: each is one device with its share of it.
      const double r = m.ranks;
      hw.memory_bandwidth_gbps /= r;
      hw.bf16_tflops /= r;
      hw.fp8_tflops /= r;
      hw.fp4_tflops /= r;
      hw.memory_gib /= r;
    }
    hw.devices_per_node = std::max(hw.devices_per_node, m.ranks);
  }
  hw.eff.comm = 1.0;
  char line[200];
  std::snprintf(line, sizeof line, "%s link from %d ranks on %d node(s): %.2f us per hop, %.2f GB/s", inter ? "inter-node" : "intra-node",
                m.ranks, m.nodes, latency_us, gbps);
  return line;
}

}  // namespace dsa::sim
