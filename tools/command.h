#pragma once
// Every `dsa` subcommand lives in its own tools/cmd_*.cpp and registers itself here;
// main() only builds the CLI11 app, runs it and turns dsa::Error into one clean message.
#include <CLI/CLI.hpp>
#include <vector>

namespace dsa::cli {

using Setup = void (*)(CLI::App& app);

struct Registrar {
  Registrar(int order, Setup setup);  // lower order is listed first in --help
};

struct Entry {
  int order;
  Setup setup;
};
std::vector<Entry>& registry();

}  // namespace dsa::cli

#define DSA_COMMAND(order, fn) static const ::dsa::cli::Registrar dsa_registrar_##fn(order, fn)
