// The safetensors file parser on a fuzzed file image (8-byte header length, JSON header,
// data region), from memory: parse_safetensors is what SafeTensors::open runs on each mapped
// shard. Accepted files must describe tensors that lie inside the image, hold exactly the
// bytes their dtype and shape need, and do not overlap.
#include <algorithm>
#include <vector>

#include "core/error.h"
#include "fuzz_util.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<dsa::TensorInfo> tensors;
  try {
    tensors = dsa::parse_safetensors(data, size, "fuzz.safetensors");
  } catch (const dsa::Error&) {
    return 0;
  }
  std::vector<std::pair<const uint8_t*, size_t>> extents;
  for (const dsa::TensorInfo& t : tensors) {
    FUZZ_CHECK(t.data >= data + 8 && t.data + t.nbytes <= data + size, t.name + ": data outside the image");
    FUZZ_CHECK(t.numel() >= 0, t.name);
    FUZZ_CHECK(uint64_t(t.numel()) * dsa::dtype_size(t.dtype) == t.nbytes, t.name + ": size does not match the shape");
    FUZZ_CHECK(t.file == "fuzz.safetensors", t.file);
    // Read the first and last byte so that ASan checks the range really is in the buffer.
    if (t.nbytes) {
      volatile uint8_t sink = t.data[0] ^ t.data[t.nbytes - 1];
      (void)sink;
      extents.emplace_back(t.data, t.nbytes);
    }
    (void)t.shape_str();
  }
  std::sort(extents.begin(), extents.end());
  for (size_t i = 1; i < extents.size(); ++i)
    FUZZ_CHECK(extents[i - 1].first + extents[i - 1].second <= extents[i].first, "overlapping tensors accepted");
  return 0;
}
