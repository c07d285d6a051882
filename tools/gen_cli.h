#pragma once
// Flags shared by the generating commands (run, chat): sampling, the seed, MTP.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <random>
#include <string>

#include "cli_util.h"
#include "runtime/generator.h"
#include "sampling/sampler.h"

namespace dsa::cli {

struct SamplingFlags {
  SamplerParams p;
  CLI::Option* seed = nullptr;

  void add(CLI::App* cmd) {
    cmd->add_flag("--greedy", p.greedy, "Always take the most likely token (after penalties)");
    cmd->add_option("--temp", p.temperature, "Temperature; 0 is greedy")->capture_default_str()->check(finite_in(0, 1000));
    cmd->add_option("--top-k", p.top_k, "Keep the k most likely tokens; 0 = off")->capture_default_str()->check(int_in(0, INT32_MAX));
    cmd->add_option("--top-p", p.top_p, "Keep the smallest set with this much probability; 1 = off")->capture_default_str()->check(finite_in(0, 1));
    cmd->add_option("--min-p", p.min_p, "Drop tokens below min-p times the top probability; 0 = off")->capture_default_str()->check(finite_in(0, 1));
    cmd->add_option("--repeat-penalty", p.repeat_penalty, "Divide positive / multiply negative logits of seen tokens; 1 = off")
        ->capture_default_str()
        ->check(finite_in(0, 1e6));
    cmd->add_option("--presence-penalty", p.presence_penalty, "Subtract once from the logit of every seen token")
        ->capture_default_str()
        ->check(finite_in(-1e6, 1e6));
    cmd->add_option("--frequency-penalty", p.frequency_penalty, "Subtract count times this from seen tokens' logits")
        ->capture_default_str()
        ->check(finite_in(-1e6, 1e6));
    cmd->add_option("--repeat-last-n", p.penalty_last_n, "Tokens of history the penalties look at; -1 = all")
        ->capture_default_str()
        ->check(int_in(-1, INT32_MAX));
    seed = cmd->add_option("--seed", p.seed, "Random seed (default: a fresh one, printed so the run can be repeated)")
               ->check(seed_value());
  }

  // Picks a seed when none was given, and says which, so any run can be reproduced.
  SamplerParams resolve() {
    if (seed && seed->count() == 0 && !p.greedy && p.temperature > 0) {
      std::random_device rd;
      p.seed = (uint64_t(rd()) << 32) ^ rd();
      std::fprintf(stderr, "seed: %llu\n", static_cast<unsigned long long>(p.seed));
    }
    return p;
  }
};

inline constexpr const char* kMtpHelp =
    "Speculative decoding with the checkpoint's MTP layer (same output distribution; greedy: the same tokens)";

// " | mtp: A/D drafts accepted (P%)" for the statistics line, or "" when nothing was drafted.
inline std::string mtp_summary(const GenerateResult& r) {
  if (r.drafted == 0) return "";
  char b[96];
  std::snprintf(b, sizeof b, " | mtp: %d/%d drafts accepted (%.0f%%)", r.accepted, r.drafted, 100.0 * r.acceptance());
  return b;
}

}  // namespace dsa::cli
