#pragma once
// The interconnect as measured on a real job: the JSON `mpirun -np N dsa bench comm --json`
// prints (the all-reduce of tokens x hidden floats at several sizes, slowest rank, medians)
// turned into the hardware profile's link figures, so that `dsa plan --comm FILE` costs
// communication with the cluster's own latency and bandwidth instead of a datasheet's.
#include <string>
#include <vector>

#include "sim/hardware.h"

namespace dsa::sim {

struct CommMeasurement {
  int ranks = 0, nodes = 0;
  std::vector<double> bytes, median_us;  // one entry per measured size
};

// Throws dsa::Error naming the file and the field when it is not bench comm's JSON.
CommMeasurement load_comm_measurement(const std::string& path);

// Fits t = hops * latency + moved / bandwidth to the points, with the planner's ring
// all-reduce (hops = 2 (n - 1), moved = 2 (n - 1) / n of the bytes per rank), by least
// squares, and writes them as the profile's inter-node link (ranks on several nodes) or its
// intra-node link (one node: the ranks split the node, so each device is 1/ranks of the
// profile's measured machine when it is `local`). The figures are achieved ones: the link
// efficiency becomes 1. Returns a line saying what was set.
std::string calibrate_links(Hardware& hw, const CommMeasurement& m);

}  // namespace dsa::sim
