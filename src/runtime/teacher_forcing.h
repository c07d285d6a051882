#pragma once
// Teacher forcing: ONE prefill step over ids[0:prompt_len], then one-token decode steps for
// the remaining ids, collecting every row of logits (the contract of `dsa logits` and of
// the golden cases), optionally the MTP layer's logits and the golden-named internals.
// With batch_with > 0, that many other sequences (random ids, random lengths) prefill and
// decode in the same steps; the result does not change (batch-invariant numerics).
#include <cstdint>
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

struct TeacherForcingOptions {
  CacheType cache = CacheType::FP8;
  bool mtp = false;        // also the MTP layer's logits
  bool internals = false;  // also the golden-named internals (not with batch_with)
  int batch_with = 0;      // other sequences stepping together with it
  uint64_t batch_seed = 1; // their ids and lengths
  int block_size = 64;     // cache block size (a block as large as the sequence: contiguous)
};

TeacherForcedResult run_teacher_forced(const Model& m, const std::vector<int32_t>& ids, int prompt_len, const TeacherForcingOptions& o);

inline TeacherForcedResult run_teacher_forced(const Model& m, const std::vector<int32_t>& ids, int prompt_len, CacheType cache,
                                              bool mtp, bool internals) {
  TeacherForcingOptions o;
  o.cache = cache;
  o.mtp = mtp;
  o.internals = internals;
  return run_teacher_forced(m, ids, prompt_len, o);
}

}  // namespace dsa
