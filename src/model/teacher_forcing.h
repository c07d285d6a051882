#pragma once
// Teacher forcing: ONE prefill over ids[0:prompt_len], then one-token decode steps for
// the remaining ids, collecting every row of logits (the contract of `dsa logits` and of
// the golden cases), optionally the MTP layer's logits and the golden-named internals.
#include <map>
#include <string>
#include <vector>

#include "model/forward.h"

namespace dsa {

struct TeacherForcedResult {
  int T = 0, vocab = 0;
  std::vector<float> logits;      // [T, vocab]
  std::vector<float> mtp_logits;  // [T-1, vocab] when requested
  // Internals by golden name, laid out [rows, width] (scores padded with -inf).
  struct F { std::vector<int64_t> shape; std::vector<float> v; };
  struct I { std::vector<int64_t> shape; std::vector<int32_t> v; };
  std::map<std::string, F> floats;
  std::map<std::string, I> ints;
};

TeacherForcedResult run_teacher_forced(const Model& m, const std::vector<int32_t>& ids, int prompt_len, CacheType cache,
                                       bool mtp, bool internals);

}  // namespace dsa
