#pragma once
// 2 MiB pages for what a step reads at scattered places: the checkpoint's mappings
// (MmapFile) and the KV cache pool (AnonBuffer).
//
// AnonBuffer: zeroed anonymous memory mapped at a 2 MiB boundary and marked MADV_HUGEPAGE,
// so that where transparent huge pages are "always" or "madvise" (most distributions'
// default) the kernel backs it with 2 MiB pages as it is first touched. Sparse attention
// gathers its 2048 selected tokens from all over a layer's cache, and on 4 KiB pages most of
// them miss the TLB. Memory is committed only as it is touched, as with calloc.
// DSA_HUGEPAGES=0 leaves both at the system's default page size.
#include <cstddef>
#include <cstdint>

namespace dsa {

// False when DSA_HUGEPAGES=0 (read once).
bool huge_pages_wanted();

// Address space for `bytes` (rounded up to whole pages) starting at a 2 MiB boundary,
// reserved inaccessible and uncommitted, or nullptr. The caller maps over it with MAP_FIXED
// (on failure, munmap it); a 2 MiB boundary is what lets the kernel give a mapping 2 MiB
// pages from its first byte.
void* reserve_huge_aligned(size_t bytes);

class AnonBuffer {
public:
  AnonBuffer() = default;
  // bytes rounded up to whole pages (at least one); data() is nullptr when the system
  // refuses the mapping.
  explicit AnonBuffer(size_t bytes);
  ~AnonBuffer();
  AnonBuffer(const AnonBuffer&) = delete;
  AnonBuffer& operator=(const AnonBuffer&) = delete;
  AnonBuffer(AnonBuffer&& o) noexcept;
  AnonBuffer& operator=(AnonBuffer&& o) noexcept;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  // Bytes of the buffer the kernel maps with 2 MiB pages now (0 where it cannot tell).
  size_t huge_bytes() const;
  // Whether the buffer carries the MADV_HUGEPAGE advice (the "hg" flag of its mapping).
  bool huge_advised() const;

private:
  void release();
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Sums the `field` lines (e.g. "AnonHugePages") of the /proc/self/smaps entries that start
// inside [p, p + n), in bytes; 0 where smaps cannot be read.
size_t smaps_bytes(const void* p, size_t n, const char* field);

}  // namespace dsa
