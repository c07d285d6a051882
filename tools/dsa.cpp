// The one binary: `dsa <command> ...`. Commands register themselves (see command.h).
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>
#include <string>

#include "cli_util.h"
#include "command.h"
#include "core/error.h"
#include "core/numa.h"
#include "core/threads.h"
#include "kernels/kernels.h"
#include "runtime/dist.h"

namespace dsa::cli {

std::vector<Entry>& registry() {
  static std::vector<Entry> r;
  return r;
}

Registrar::Registrar(int order, Setup setup) { registry().push_back({order, setup}); }

}  // namespace dsa::cli

namespace {

// One error line; in an MPI job it names the rank and ends every rank (no rank is left
// waiting in a collective for this one).
int fail(const std::string& message) {
  if (dsa::dist::active()) dsa::dist::abort_job(message);
  std::fprintf(stderr, "error: %s\n", message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  // One thread per physical core unless OMP_NUM_THREADS says otherwise (-t overrides both
  // where a command offers it).
  if (!std::getenv("OMP_NUM_THREADS")) omp_set_num_threads(dsa::physical_cores());
  // The same bound as -t: 100000 threads crash libgomp, 20000 never finish starting.
  const int max_threads = dsa::cli::max_threads();
  if (omp_get_max_threads() > max_threads) {
    std::fprintf(stderr, "error: OMP_NUM_THREADS asks for %d threads; at most %d (4 per logical CPU) are allowed\n", omp_get_max_threads(),
                 max_threads);
    return 1;
  }
  // The kernels' instruction-set tier, read now so that a bad DSA_ISA stops before any work.
  dsa::kernels::isa();
  CLI::App app{"dsa: inference engine and deployment planner for DeepSeek Sparse Attention models\n"
               "(DeepSeek-V3.2 and GLM-5 families, Hugging Face checkpoints with fp8 block weights)"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show help for every command");
  // Memory placement is set before any OpenMP region creates the workers (they inherit it):
  // auto now, then whatever --numa says while the command line is parsed, before the
  // command runs. Accepted before or after the command name (fallthrough).
  app.fallthrough();
  app.add_option_function<std::string>(
         "--numa", [](const std::string& m) { dsa::numa_setup(dsa::parse_numa_mode(m)); },
         "Memory placement on multi-socket machines: auto (interleave pages over the NUMA nodes when "
         "there are several; the default), interleave, or off")
      ->trigger_on_parse();
  auto& reg = dsa::cli::registry();
  std::sort(reg.begin(), reg.end(), [](const auto& a, const auto& b) { return a.order < b.order; });
  for (const auto& e : reg) e.setup(app);
  // CLI11 answers an unknown command with "A subcommand is required"; name it instead.
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--numa") {  // the one global option that takes a value
      ++i;
      continue;
    }
    if (arg.empty() || arg[0] == '-') continue;
    std::string names;
    bool known = false;
    for (const auto* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
      known = known || sub->get_name() == arg;
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    if (!known) {
      std::fprintf(stderr, "error: unknown command '%s' (commands: %s; see --help)\n", arg.c_str(), names.c_str());
      return 1;
    }
    break;
  }
  try {
    dsa::numa_setup(dsa::NumaMode::Auto);
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const dsa::Error& e) {
    return fail(e.what());
  } catch (const std::bad_alloc&) {
    return fail("out of memory: the request needs more memory than this machine has "
                "(a smaller --ctx, --depth, prompt or --batch needs less)");
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  dsa::dist::finalize();
  return 0;
}
