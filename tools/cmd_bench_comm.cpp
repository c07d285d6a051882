// `mpirun -np N dsa bench comm`: a collective the parallel layouts run (by default the
// expert-parallel all-reduce), timed at the sizes a step uses (tokens x hidden floats), on the
// job's ranks and interconnect. Its JSON
// is what `dsa plan --comm FILE` calibrates the interconnect with.
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_util.h"
#include "command.h"
#include "runtime/comm_bench.h"
#include "runtime/dist.h"

namespace {

struct Args {
  int hidden = 7168, repeat = 50;
  std::string tokens = "1,4,16,64,512", collective = "allreduce";
  bool json = false;
};

void run(const Args& a) {
  using namespace dsa;
  const Collective coll = parse_collective(a.collective);
  dist::init();
  if (dist::size() < 2)
    throw Error("bench comm: measures the ranks of an MPI job; start it as mpirun -np N dsa bench comm (N >= 2)");
  std::vector<int> tokens;
  for (const std::string& s : cli::split_commas(a.tokens)) {
    int n = 0;
    const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
    if (ec != std::errc() || p != s.data() + s.size() || n < 1 || n > 65536)
      throw Error("--tokens: expected comma-separated token counts in 1..65536, got '" + s + "'");
    tokens.push_back(n);
  }
  const std::vector<CommPoint> pts = measure_collective(coll, a.hidden, tokens, a.repeat);
  const int nodes = dist::node_count();
  if (dist::rank() != 0) return;
  if (a.json) {
    nlohmann::json j = {{"collective", collective_name(coll)}, {"ranks", dist::size()}, {"nodes", nodes}, {"hidden", a.hidden}, {"repeat", a.repeat}};
    for (const CommPoint& p : pts)
      j["points"].push_back({{"tokens", p.tokens}, {"bytes", p.bytes}, {"median_us", p.median_us}, {"p90_us", p.p90_us},
                             {"algbw_gbps", p.algbw_gbps}, {"busbw_gbps", p.busbw_gbps}});
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("%s of tokens x %d floats over %d ranks on %d node(s), %d repeats (slowest rank, median):\n", collective_name(coll), a.hidden,
              dist::size(), nodes, a.repeat);
  std::printf("  %7s %12s %12s %10s %12s %12s\n", "tokens", "bytes", "median us", "p90 us", "algbw GB/s", "busbw GB/s");
  for (const CommPoint& p : pts)
    std::printf("  %7d %12zu %12.1f %10.1f %12.2f %12.2f\n", p.tokens, p.bytes, p.median_us, p.p90_us, p.algbw_gbps, p.busbw_gbps);
}

void setup_bench_comm(CLI::App& app) {
  auto a = std::make_shared<Args>();
  auto* cmd = app.get_subcommand("bench")->add_subcommand(
      "comm", "Measure a parallel layout's collective on an MPI job's ranks (mpirun -np N dsa bench comm)");
  cmd->add_option("--hidden", a->hidden, "Floats per token (the model's hidden size; DeepSeek-V3.2: 7168)")
      ->capture_default_str()
      ->check(dsa::cli::int_in(1, 1 << 20));
  cmd->add_option("--collective", a->collective,
                  "allreduce (--ep's MoE output), allgather (--tp's rows, --ep --dp's tokens), send (--pp's stage to stage), broadcast (--pp's logits), "
                  "alltoall (--ep --dp's tokens to their experts' ranks)")
      ->capture_default_str();
  cmd->add_option("--tokens", a->tokens, "Token counts to time (decode steps to prefill chunks)")->capture_default_str();
  cmd->add_option("--repeat", a->repeat, "Timed repeats per size; median and p90 reported")->capture_default_str()->check(dsa::cli::int_in(1, 100000));
  cmd->add_flag("--json", a->json, "Print one JSON object");
  cmd->callback([a] { run(*a); });
}

}  // namespace

DSA_COMMAND(72, setup_bench_comm);
