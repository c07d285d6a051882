#pragma once
// Errors at the boundaries (files, config, user input) are exceptions carrying the
// thing that was wrong and what was expected; internal invariants abort via DSA_CHECK.
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace dsa {

class Error : public std::runtime_error {
public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace dsa

// Kernel preconditions and internal invariants: abort with file:line in every build type.
#define DSA_CHECK(cond, msg)                                                          \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      std::fprintf(stderr, "%s:%d: check failed: %s: %s\n", __FILE__, __LINE__, #cond, \
                   std::string(msg).c_str());                                         \
      std::abort();                                                                   \
    }                                                                                 \
  } while (0)
