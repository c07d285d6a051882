#pragma once
// Presentation of a plan: aligned text tables, one JSON object for scripts, SVG line plots.
#include <string>
#include <vector>

#include "sim/search.h"
#include "sim/simulate.h"

namespace dsa::sim {

struct PlanContext {  // what the report echoes back
  const SimModel* model = nullptr;
  const Hardware* hw = nullptr;
  const PlanRequest* req = nullptr;
};

struct SweepRow {
  std::string axis;  // "context" or "batch"
  int64_t value = 0;
  double tpot_ms = 0, decode_tokens_per_s_per_device = 0, decode_cost_per_m = 0, prefill_cost_per_m = 0;
  bool fits = true;
};

std::string format_text(const PlanContext& c, const PlanResult& p, const std::vector<SweepRow>& sweeps, bool show_ops);
std::string format_json(const PlanContext& c, const PlanResult& p, const std::vector<SweepRow>& sweeps);

// `dsa plan --search`: the targets, how many layouts were tried, and the best `top`
// candidates as a table (with the `dsa plan` command that shows the first in full) or JSON;
// with several profiles each row names its own.
std::string format_search_text(const PlanContext& c, const std::vector<Hardware>& hws, const SearchRequest& s,
                               const SearchResult& r, int top);
std::string format_search_json(const PlanContext& c, const std::vector<Hardware>& hws, const SearchRequest& s,
                               const SearchResult& r, int top);

struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;
  bool dashed = false;
};
// A self-contained SVG line chart with axes, ticks and a legend.
std::string svg_line_plot(const std::string& title, const std::string& xlabel, const std::string& ylabel,
                          const std::vector<Series>& series, bool log_x);

}  // namespace dsa::sim
