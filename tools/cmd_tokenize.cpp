// `dsa tokenize --model DIR [--decode]`: text <-> token ids through the model's tokenizer.json,
// one JSON value per line on stdin and stdout. External checks call this; keep the contract:
//   encode: each input line is a JSON string; prints a JSON array of ids (never adds BOS).
//   decode: each input line is a JSON array of ids; prints a JSON string (invalid UTF-8 from
//           arbitrary ids becomes U+FFFD, so the output is always valid JSON).
// A bad line stops with an error naming its line number and a non-zero exit.
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "command.h"
#include "core/error.h"
#include "io/json.h"
#include "tokenizer/tokenizer.h"

namespace {

struct Args {
  std::string model;
  bool decode = false;
};

void emit(const std::string& s) {
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);  // one reply per request line, so callers may drive it interactively
}

void run(const Args& a) {
  using dsa::Error;
  const dsa::Tokenizer tok = dsa::Tokenizer::from_dir(a.model);
  std::string line;
  for (long n = 1; std::getline(std::cin, line); ++n) {
    const std::string where = "stdin line " + std::to_string(n) + ": ";
    nlohmann::json v;
    try {
      v = dsa::parse_json_bounded(line);
    } catch (const nlohmann::json::exception& e) {
      throw Error(where + "not valid JSON (" + e.what() + ")");
    }
    if (!a.decode) {
      if (!v.is_string()) throw Error(where + "expected a JSON string, got " + v.type_name());
      emit(nlohmann::json(tok.encode(v.get_ref<const std::string&>(), /*add_bos=*/false)).dump());
    } else {
      if (!v.is_array()) throw Error(where + "expected a JSON array of token ids, got " + v.type_name());
      std::vector<int32_t> ids;
      ids.reserve(v.size());
      for (const auto& x : v) {
        // Range-checked before narrowing (-2^32 must not become 0).
        if (!dsa::json_int_in(x, 0, INT32_MAX) || !tok.is_valid_id(static_cast<int32_t>(x.get<int64_t>())))
          throw Error(where + "not a token id of this tokenizer: " + x.dump() + " (valid: 0.." +
                      std::to_string(tok.vocab_size() - 1) + ")");
        ids.push_back(static_cast<int32_t>(x.get<int64_t>()));
      }
      emit(nlohmann::json(tok.decode(ids)).dump());  // decode() already repaired the UTF-8
    }
  }
}

void setup_tokenize(CLI::App& app) {
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("tokenize", "Tokenize JSON strings from stdin (one per line) to JSON id arrays, or --decode back");
  cmd->add_option("--model", a->model, "Directory with tokenizer.json (and optionally tokenizer_config.json)")->required();
  cmd->add_flag("--decode", a->decode, "Input lines are JSON id arrays; print JSON strings");
  cmd->callback([a] { run(*a); });
}

}  // namespace

DSA_COMMAND(60, setup_tokenize);
