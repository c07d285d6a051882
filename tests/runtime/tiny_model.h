#pragma once
// A random-weight tiny model with the synthetic tokenizer, made once per test binary in
// the temp directory (removed at exit).
#include <unistd.h>

#include <filesystem>
#include <string>

#include "model/make_model.h"
#include "runtime/synthetic_tokenizer.h"

namespace dsa::test {

inline const std::string& tiny_model_dir() {
  struct Dir {
    std::string path;
    Dir() {
      path = (std::filesystem::temp_directory_path() / ("dsa_gen_tiny_" + std::to_string(::getpid()))).string();
      MakeModelOptions o;
      o.preset = "tiny";
      o.out_dir = path;
      o.verbose = false;
      make_model(o);
      write_synthetic_tokenizer(path, 1024);
    }
    ~Dir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Dir d;
  return d.path;
}

}  // namespace dsa::test
