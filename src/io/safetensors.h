#pragma once
// safetensors: 8-byte little-endian header length, a JSON header
// {name: {dtype, shape, data_offsets: [begin, end]}}, then the raw data region.
// A checkpoint is one file or several shards listed in model.safetensors.index.json.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/mmap_file.h"

namespace dsa {

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // points into the mapping
  size_t nbytes = 0;
  std::string file;               // shard it lives in, for error messages

  int64_t numel() const;
  std::string shape_str() const;  // "[576, 7168]"
};

// All tensors of one checkpoint folder (or one .safetensors file), memory-mapped.
class SafeTensors {
public:
  // `path` is a directory (model.safetensors.index.json, else model.safetensors, else the
  // only *.safetensors file) or a single .safetensors file. Throws dsa::Error.
  static SafeTensors open(const std::string& path);

  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  const TensorInfo* find(const std::string& name) const;
  const TensorInfo& get(const std::string& name) const;  // throws naming the missing tensor
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  size_t num_files() const { return files_.size(); }
  size_t total_bytes() const;
  // The share of the files' bytes the kernel maps in 2 MiB pages now (MmapFile::huge_bytes).
  double huge_fraction() const;
  // Maps every file's pages now (MmapFile::populate), one file at a time; `progress` is
  // called after each with the files and bytes done so far.
  void populate(const std::function<void(size_t files_done, size_t bytes_done)>& progress = {}) const;
  // Only the byte range `part` gives each tensor ({offset, length} within it: an
  // expert-parallel rank reads its own); bytes_done counts those ranges.
  void populate(const std::function<std::pair<size_t, size_t>(const std::string& tensor, const TensorInfo& t)>& part,
                const std::function<void(size_t files_done, size_t bytes_done)>& progress) const;

private:
  void add_file(const std::string& path);
  std::vector<std::unique_ptr<MmapFile>> files_;
  std::map<std::string, TensorInfo> tensors_;
};

// The parsers behind SafeTensors::open, on bytes already in memory (the fuzz targets call
// them directly). Both throw dsa::Error naming `path` and the field that is wrong.
//
// One .safetensors file image: the 8-byte header length, the JSON header, the data region.
// Checks what open() checks: known dtypes, shapes whose byte size matches the stored range,
// offsets inside the data region, no duplicate names, no overlapping tensors. The tensors'
// `data` point into `data`, in header order.
std::vector<TensorInfo> parse_safetensors(const uint8_t* data, size_t size, const std::string& path);
// model.safetensors.index.json: its weight_map, tensor name -> shard file name (a plain file
// name beside the index).
std::map<std::string, std::string> parse_safetensors_index(const std::string& text, const std::string& path);

// A tensor to be written: name, dtype, shape and raw little-endian bytes.
struct TensorBlob {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

TensorBlob make_blob_f32(const std::string& name, std::vector<int64_t> shape, const float* data);
TensorBlob make_blob_i32(const std::string& name, std::vector<int64_t> shape, const int32_t* data);

// Writes a .safetensors file atomically (temp file + rename), so a failure never leaves
// a half-written output behind. Throws dsa::Error.
void write_safetensors(const std::string& path, const std::vector<TensorBlob>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace dsa
