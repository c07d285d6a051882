#pragma once
// Read-only memory map of a whole file. Weights are views into these mappings and are
// never copied or converted.
#include <cstddef>
#include <cstdint>
#include <string>

namespace dsa {

class MmapFile {
public:
  MmapFile() = default;
  explicit MmapFile(const std::string& path);  // throws dsa::Error naming the path
  ~MmapFile();
  MmapFile(const MmapFile&) = delete;
  MmapFile& operator=(const MmapFile&) = delete;
  MmapFile(MmapFile&& o) noexcept;
  MmapFile& operator=(MmapFile&& o) noexcept;

  // Maps every page of the file into this process now (reading from disk what the page
  // cache lacks) instead of on first touch: a lazily mapped checkpoint pays a page fault per
  // 64 KB the first time each weight is used, which made the first decode tokens a third
  // slower with the file cached and several times slower with it on disk (random reads
  // instead of one sequential pass). Nothing is copied or converted.
  void populate() const;
  // The same for the pages of [p, p + n), a range inside the mapping.
  void populate(const uint8_t* p, size_t n) const;
  // populate(), then, when most of the file sits in the page cache in 4 KiB pages (a file
  // just written or copied) and the file system holds files in 2 MiB folios, drops those
  // pages and reads the file again, once, so that it is mapped in 2 MiB pages: a decode
  // step's scattered expert reads then cost a TLB entry per 2 MiB instead of a page walk per
  // 4 KiB (10-20% faster decode and prefill on v32-mini, docs/PERFORMANCE.md). A 64 MiB
  // trial first; once a trial comes back in 4 KiB pages, no file of the process is tried
  // again. DSA_HUGEPAGES=0 keeps the file as it is cached.
  void populate_huge() const;
  // Bytes of the mapping the kernel maps with 2 MiB entries now (0 where it cannot tell).
  size_t huge_bytes() const;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

private:
  void reread(size_t off, size_t len) const;
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// The whole of a small text file (config.json, a tokenizer, a profile, a prompt): one error
// naming the path when it is missing, not a regular file (a directory, a FIFO that would
// block, /dev/zero that never ends) or larger than max_bytes.
std::string read_text_file(const std::string& path, const std::string& what, size_t max_bytes = size_t(256) << 20);

}  // namespace dsa
