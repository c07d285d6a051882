// model.safetensors.index.json: the fuzzed text and type-confused variants of it
// (fuzz_util.h) go through parse_safetensors_index, and when they parse, through
// SafeTensors::open on a scratch folder holding the index beside three fixed shards
// (shard1: a, b; shard2: c; shard3: a again), so the sharded open path runs too: shards
// named by the map, tensors missing from their shard, a tensor in two shards.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "fuzz_util.h"
#include "io/json.h"
#include "io/safetensors.h"

namespace fs = std::filesystem;

namespace {

std::string g_dir;

void remove_dir() {
  std::error_code ec;
  if (!g_dir.empty()) fs::remove_all(g_dir, ec);
}

dsa::TensorBlob blob(const std::string& name, float v) {
  const float x[2] = {v, v};
  return dsa::make_blob_f32(name, {2}, x);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  std::string tmpl = (fs::temp_directory_path() / "dsa_fuzz_index_XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) {
    std::perror("mkdtemp");
    std::exit(1);
  }
  g_dir = tmpl;
  std::atexit(remove_dir);
  dsa::write_safetensors(g_dir + "/shard1.safetensors", {blob("a", 1), blob("b", 2)});
  dsa::write_safetensors(g_dir + "/shard2.safetensors", {blob("c", 3)});
  dsa::write_safetensors(g_dir + "/shard3.safetensors", {blob("a", 4)});
  return 0;
}

// The index text through the parser, and when it parses, through SafeTensors::open.
void check(const std::string& text) {
  const std::string index = g_dir + "/model.safetensors.index.json";
  const auto map = dsa::parse_safetensors_index(text, index);  // dsa::Error: refused
  for (const auto& [name, shard] : map)
    FUZZ_CHECK(!shard.empty() && shard != "." && shard != ".." && shard.find('/') == std::string::npos &&
                   shard.find('\0') == std::string::npos,
               "shard name accepted: " + shard);
  {
    std::ofstream out(index, std::ios::binary | std::ios::trunc);
    out.write(text.data(), std::streamsize(text.size()));
  }
  const auto st = dsa::SafeTensors::open(g_dir);
  // What open() promised: every listed tensor is there, from the shard the map names.
  for (const auto& [name, shard] : map) {
    const dsa::TensorInfo& t = st.get(name);
    FUZZ_CHECK(t.file == g_dir + "/" + shard, name + " read from " + t.file + ", index says " + shard);
  }
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dsa::fuzz::run_json_text(dsa::fuzz::as_view(data, size), 16, check);
  return 0;
}
