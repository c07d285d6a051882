#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/mmap_file.h"
#include "io/json.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace dsa {

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorInfo::shape_str() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

size_t SafeTensors::total_bytes() const {
  size_t n = 0;
  for (const auto& f : files_) n += f->size();
  return n;
}

double SafeTensors::huge_fraction() const {
  size_t n = 0;
  for (const auto& f : files_) n += f->huge_bytes();
  return double(n) / double(std::max<size_t>(1, total_bytes()));
}

void SafeTensors::populate(const std::function<void(size_t, size_t)>& progress) const {
  size_t done = 0;
  for (size_t i = 0; i < files_.size(); ++i) {
    files_[i]->populate_huge();
    done += files_[i]->size();
    if (progress) progress(i + 1, done);
  }
}

void SafeTensors::populate(const std::function<std::pair<size_t, size_t>(const std::string&, const TensorInfo&)>& part,
                           const std::function<void(size_t, size_t)>& progress) const {
  size_t done = 0;
  for (size_t i = 0; i < files_.size(); ++i) {
    std::vector<std::pair<const uint8_t*, size_t>> ranges;
    bool whole = true;  // every tensor of the file wanted whole (one process, or a rank's own shard file)
    size_t bytes = 0;
    for (const auto& [name, t] : tensors_) {
      if (t.file != files_[i]->path()) continue;
      const auto [off, len] = part(name, t);
      DSA_CHECK(off + len <= t.nbytes, "SafeTensors::populate: a range outside tensor " + name);
      ranges.emplace_back(t.data + off, len);
      whole = whole && off == 0 && len == t.nbytes;
      bytes += len;
    }
    if (whole) {
      files_[i]->populate_huge();
    } else {
      for (const auto& [p, len] : ranges) files_[i]->populate(p, len);
    }
    done += bytes;
    if (progress) progress(i + 1, done);
  }
}

const TensorInfo* SafeTensors::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

const TensorInfo& SafeTensors::get(const std::string& name) const {
  const TensorInfo* t = find(name);
  if (!t) throw Error("missing tensor '" + name + "' in checkpoint");
  return *t;
}

namespace {

// A JSON integer in [0, max] as uint64_t. get<uint64_t>() would wrap -1 to 2^64-1, and
// converting a float such as 1e300 to an integer is undefined behaviour.
bool json_uint_at_most(const json& v, uint64_t max, uint64_t* out) {
  if (!v.is_number_integer()) return false;
  if (v.is_number_unsigned()) *out = v.get<uint64_t>();
  else if (v.get<int64_t>() < 0) return false;
  else *out = uint64_t(v.get<int64_t>());
  return *out <= max;
}

}  // namespace

std::vector<TensorInfo> parse_safetensors(const uint8_t* data, size_t size, const std::string& path) {
  if (size < 8) throw Error("'" + path + "': truncated safetensors file (" + std::to_string(size) + " bytes, need at least 8)");
  uint64_t header_len = 0;
  std::memcpy(&header_len, data, 8);
  if (header_len > size - 8)
    throw Error("'" + path + "': header length " + std::to_string(header_len) + " exceeds file size " + std::to_string(size));
  json header;
  try {
    // Duplicate tensor names would silently keep the last entry (nlohmann's rule): refuse.
    std::set<std::string> seen;
    header = json::parse(data + 8, data + 8 + header_len, [&](int depth, json::parse_event_t ev, json& v) {
      if (depth > kMaxJsonDepth) throw JsonTooDeep();
      if (ev == json::parse_event_t::key && depth == 1 && !seen.insert(v.get<std::string>()).second)
        throw Error("'" + path + "': tensor '" + v.get<std::string>() + "' appears twice in the safetensors header");
      return true;
    });
  } catch (const json::exception& e) {
    throw Error("'" + path + "': malformed safetensors header: " + e.what());
  }
  if (!header.is_object()) throw Error("'" + path + "': safetensors header is not a JSON object");
  const uint8_t* base = data + 8 + header_len;
  const size_t data_size = size - 8 - header_len;
  std::vector<TensorInfo> out;
  for (auto& [name, v] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string where = "'" + path + "': tensor '" + name + "'";
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      throw Error(where + ": header entry needs dtype, shape and data_offsets");
    TensorInfo t;
    t.name = name;
    t.file = path;
    const json& dt = v.at("dtype");
    if (!dt.is_string()) throw Error(where + ": dtype must be a string, got " + dt.dump());
    if (!dtype_from_name(dt.get<std::string>(), &t.dtype)) throw Error(where + ": unsupported dtype '" + dt.get<std::string>() + "'");
    const json& shape = v.at("shape");
    if (!shape.is_array()) throw Error(where + ": shape must be a list of integers, got " + shape.dump());
    // The byte count must not wrap (a [2^32, 2^32] shape would otherwise "need 0 bytes"), and
    // every partial product stays below 2^63 so that numel() cannot overflow either (a zero
    // dimension after [2^62, 2] would hide it from the final count).
    uint64_t want = dtype_size(t.dtype);
    for (const auto& d : shape) {
      uint64_t x = 0;
      if (!json_uint_at_most(d, uint64_t(INT64_MAX), &x))
        throw Error(where + ": shape entries must be integers in [0, 2^63), got " + d.dump());
      t.shape.push_back(int64_t(x));
      if (__builtin_mul_overflow(want, x, &want) || want > uint64_t(INT64_MAX))
        throw Error(where + ": shape " + t.shape_str() + " is too large");
    }
    const json& off = v.at("data_offsets");
    uint64_t b = 0, e = 0;
    if (!off.is_array() || off.size() != 2 || !json_uint_at_most(off[0], UINT64_MAX, &b) || !json_uint_at_most(off[1], UINT64_MAX, &e))
      throw Error(where + ": data_offsets must be [begin, end] (two non-negative integers), got " + off.dump());
    if (b > e || e > data_size)
      throw Error(where + ": data_offsets [" + std::to_string(b) + ", " + std::to_string(e) +
                  "] outside the data region of " + std::to_string(data_size) + " bytes (truncated file?)");
    t.data = base + b;
    t.nbytes = size_t(e - b);
    if (want != t.nbytes)
      throw Error(where + ": " + std::to_string(t.nbytes) + " bytes stored, but " + dtype_name(t.dtype) + " " +
                  t.shape_str() + " needs " + std::to_string(want));
    out.push_back(std::move(t));
  }
  // Two tensors sharing bytes means a corrupt header (writers lay tensors out back to back).
  std::vector<const TensorInfo*> order;
  for (const TensorInfo& t : out)
    if (t.nbytes > 0) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const TensorInfo* a, const TensorInfo* b) { return a->data < b->data; });
  for (size_t i = 1; i < order.size(); ++i)
    if (order[i]->data < order[i - 1]->data + order[i - 1]->nbytes)
      throw Error("'" + path + "': tensors '" + order[i - 1]->name + "' and '" + order[i]->name +
                  "' overlap in the data region (corrupt header)");
  return out;
}

std::map<std::string, std::string> parse_safetensors_index(const std::string& text, const std::string& path) {
  json j;
  try {
    j = parse_json_bounded(text);
  } catch (const json::exception& e) {
    throw Error("'" + path + "': malformed JSON: " + e.what());
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw Error("'" + path + "': expected an object 'weight_map'");
  std::map<std::string, std::string> out;
  for (auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string()) throw Error("'" + path + "': weight_map['" + name + "'] is not a file name");
    const std::string s = file.get<std::string>();
    // The shard is opened beside the index: no path separators, no "." or "..", and no NUL
    // (open() would stop reading the name there).
    if (s.empty() || s == "." || s == ".." || s.find_first_of(std::string("/\0", 2)) != std::string::npos)
      throw Error("'" + path + "': shard name " + file.dump() + " must be a plain file name");
    out.emplace(name, s);
  }
  return out;
}

void SafeTensors::add_file(const std::string& path) {
  auto file = std::make_unique<MmapFile>(path);
  for (TensorInfo& t : parse_safetensors(file->data(), file->size(), path)) {
    if (tensors_.count(t.name)) throw Error("'" + path + "': tensor '" + t.name + "': tensor appears in more than one file");
    std::string name = t.name;
    tensors_.emplace(std::move(name), std::move(t));
  }
  files_.push_back(std::move(file));
}

SafeTensors SafeTensors::open(const std::string& path) {
  SafeTensors st;
  if (!fs::exists(path)) throw Error("'" + path + "' does not exist");
  if (!fs::is_directory(path)) {
    st.add_file(path);
    return st;
  }
  const fs::path dir(path);
  const fs::path index = dir / "model.safetensors.index.json";
  if (fs::exists(index)) {
    const auto weight_map =
        parse_safetensors_index(read_text_file(index.string(), "safetensors index", size_t(64) << 20), index.string());
    std::set<std::string> shards;
    for (const auto& [name, file] : weight_map) shards.insert(file);
    for (const auto& s : shards) st.add_file((dir / s).string());
    // Each listed tensor must come from the shard the map names: an index that disagrees
    // with the files is corrupt, whichever shard happens to hold the name.
    for (const auto& [name, file] : weight_map) {
      const TensorInfo* t = st.find(name);
      if (!t || t->file != (dir / file).string())
        throw Error("tensor '" + name + "' listed in '" + index.string() + "' is missing from shard '" + file + "'" +
                    (t ? " (it is in '" + fs::path(t->file).filename().string() + "')" : ""));
    }
    return st;
  }
  if (fs::exists(dir / "model.safetensors")) {
    st.add_file((dir / "model.safetensors").string());
    return st;
  }
  std::vector<fs::path> found;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") found.push_back(e.path());
  if (found.size() != 1)
    throw Error("'" + path + "': expected model.safetensors.index.json or model.safetensors (found " +
                std::to_string(found.size()) + " .safetensors files)");
  st.add_file(found[0].string());
  return st;
}

TensorBlob make_blob_f32(const std::string& name, std::vector<int64_t> shape, const float* data) {
  TensorBlob b{name, DType::F32, std::move(shape), {}};
  int64_t n = 1;
  for (auto d : b.shape) n *= d;
  b.bytes.resize(size_t(n) * 4);
  if (n) std::memcpy(b.bytes.data(), data, b.bytes.size());
  return b;
}

TensorBlob make_blob_i32(const std::string& name, std::vector<int64_t> shape, const int32_t* data) {
  TensorBlob b{name, DType::I32, std::move(shape), {}};
  int64_t n = 1;
  for (auto d : b.shape) n *= d;
  b.bytes.resize(size_t(n) * 4);
  if (n) std::memcpy(b.bytes.data(), data, b.bytes.size());
  return b;
}

namespace {
// A large file just written is flushed and its pages dropped from the page cache, so that the
// first run that maps it reads it back from disk. Pages the writes left in the cache are small
// and scattered; read back they come as large folios, and on the development machines the
// weight stream of a decode step ran 1.5-2x faster from those (v32-mini's fp8 experts 12-16
// against 21-40 GB/s), so a freshly made model would otherwise be measured slow until evicted.
void drop_written_pages(const std::string& path, uint64_t data_bytes) {
  if (data_bytes < (uint64_t(64) << 20)) return;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  if (::fdatasync(fd) == 0) ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}
}  // namespace

void write_safetensors(const std::string& path, const std::vector<TensorBlob>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t off = 0;
  for (const auto& t : tensors) {
    size_t want = dtype_size(t.dtype);
    for (auto d : t.shape) want *= size_t(d);
    DSA_CHECK(want == t.bytes.size(), "tensor '" + t.name + "' byte size does not match its shape");
    header[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes.size()}}};
    off += t.bytes.size();
  }
  std::string h = header.dump();
  while ((h.size() + 8) % 8) h.push_back(' ');  // keep the data region 8-byte aligned
  // Only a regular file (or nothing) is replaced: renaming over a FIFO, a device or a
  // symlink would destroy it. The temporary is created exclusively (mkstemp), never
  // through a link left at a predictable name.
  std::error_code sec;
  const auto st = fs::symlink_status(path, sec);
  if (fs::exists(st) && !fs::is_regular_file(st)) throw Error("'" + path + "' exists and is not a regular file; not replacing it");
  std::string tmp = path + ".XXXXXX";
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0) throw Error("cannot write '" + path + "': " + std::strerror(errno));
  ::close(fd);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) {
      std::remove(tmp.c_str());
      throw Error("cannot write '" + tmp + "'");
    }
    const uint64_t n = h.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(h.data(), std::streamsize(h.size()));
    for (const auto& t : tensors) out.write(reinterpret_cast<const char*>(t.bytes.data()), std::streamsize(t.bytes.size()));
    out.flush();
    if (!out) {
      out.close();
      std::remove(tmp.c_str());
      throw Error("write to '" + tmp + "' failed");
    }
  }
  drop_written_pages(tmp, off);
  const mode_t mask = ::umask(0);  // mkstemp made it 0600: give it the usual permissions
  ::umask(mask);
  ::chmod(tmp.c_str(), 0666 & ~mask);
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    throw Error("cannot rename '" + tmp + "' to '" + path + "': " + ec.message());
  }
}

}  // namespace dsa
