// `dsa bench mask --model DIR (--schema FILE | --regex RE) [--prefix TEXT]`: how long a
// constrained reply's token mask takes after a reply prefix, on one core.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "command.h"
#include "core/error.h"
#include "core/mmap_file.h"
#include "runtime/json_mode.h"
#include "tokenizer/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::string model, schema, regex, prefix;
  int repeats = 15;
};

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

// The vocabulary table, the first mask (which builds what the state needs once, such as a
// pattern's vocabulary), then the median of `repeats` more from the same state.
template <class Mode, class Grammar, class Prefix>
void time_masks(const dsa::Tokenizer& tok, const Grammar& grammar, Prefix check, const Args& a) {
  if (!check.feed(a.prefix)) throw dsa::Error("bench mask: --prefix is not the start of a reply the constraint admits");
  Clock::time_point t = Clock::now();
  const dsa::JsonVocab vocab(tok, tok.vocab_size());
  std::printf("vocabulary table: %zu tokens, %.2f ms\n", vocab.size(), ms_since(t));
  std::vector<uint8_t> is_eos(vocab.size(), 0);
  is_eos[size_t(tok.eos_id())] = 1;
  Mode mode(vocab, grammar, is_eos, true);
  const std::vector<int32_t> ids = tok.encode(a.prefix);
  for (int32_t id : ids) mode.accept(id);
  t = Clock::now();
  const uint8_t* allowed = mode.allowed();
  const double first = ms_since(t);
  const auto n = std::count_if(allowed, allowed + vocab.size(), [](uint8_t x) { return x != 0; });
  std::vector<double> times;
  for (int r = 0; r < a.repeats; ++r) {
    t = Clock::now();
    (void)mode.allowed();
    times.push_back(ms_since(t));
  }
  std::sort(times.begin(), times.end());
  std::printf("prefix: %zu bytes, %zu token%s; %ld of %zu tokens allowed next\n", a.prefix.size(), ids.size(), ids.size() == 1 ? "" : "s",
              long(n), vocab.size());
  std::printf("mask, 1 thread: first %.3f ms, then median %.3f ms over %d\n", first, times[times.size() / 2], a.repeats);
}

void run(const Args& a) {
  const dsa::Tokenizer tok = dsa::Tokenizer::from_dir(a.model);
  if (!a.regex.empty()) {
    const dsa::Regex re(a.regex, dsa::Regex::Match::Whole);
    return time_masks<dsa::RegexMode>(tok, re, dsa::RegexPrefix(re), a);
  }
  nlohmann::ordered_json doc;
  try {
    doc = nlohmann::ordered_json::parse(dsa::read_text_file(a.schema, "--schema", size_t(16) << 20));
  } catch (const nlohmann::json::exception& e) {
    throw dsa::Error("bench mask: " + a.schema + " is not JSON: " + e.what());
  }
  const dsa::JsonSchema schema(doc);
  time_masks<dsa::JsonMode>(tok, schema, dsa::JsonSchemaPrefix(schema), a);
}

void setup_bench_mask(CLI::App& app) {
  auto a = std::make_shared<Args>();
  // A subcommand of `dsa bench` (registered after it).
  auto* cmd = app.get_subcommand("bench")->add_subcommand(
      "mask", "Measure a constrained reply's token mask (JSON Schema or regex) after a reply prefix (ms, one core)");
  cmd->add_option("--model", a->model, "Directory with tokenizer.json")->required();
  auto* schema = cmd->add_option("--schema", a->schema, "JSON Schema file the reply follows (response_format json_schema)")
                     ->check(dsa::cli::regular_file());
  auto* regex = cmd->add_option("--regex", a->regex, "Regular expression the whole reply matches (guided_regex)");
  schema->excludes(regex);
  cmd->add_option("--prefix", a->prefix, "The reply so far (default: empty)");
  cmd->add_option("--repeats", a->repeats, "Timed masks after the first; the median is reported")
      ->capture_default_str()
      ->check(dsa::cli::int_in(1, 1000000));
  cmd->callback([a] {
    if (a->schema.empty() && a->regex.empty()) throw dsa::Error("bench mask: give --schema FILE or --regex RE");
    run(*a);
  });
}

}  // namespace

DSA_COMMAND(73, setup_bench_mask);
