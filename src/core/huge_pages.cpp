#include "core/huge_pages.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace dsa {

namespace {
constexpr size_t kHuge = size_t(2) << 20;

// Calls fn(line) for each line of the /proc/self/smaps entries whose range starts inside
// [p, p + n) (every mapping the range was made of); false when smaps cannot be read.
template <class F>
bool for_smaps_lines(const void* p, size_t n, F&& fn) {
  FILE* f = std::fopen("/proc/self/smaps", "r");
  if (!f) return false;
  char line[512];
  bool mine = false;
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p), hi = lo + n;
  while (std::fgets(line, sizeof line, f)) {
    unsigned long a = 0, b = 0;
    if (std::sscanf(line, "%lx-%lx ", &a, &b) == 2) {  // an entry's first line (no field name is hex, then '-')
      mine = a >= lo && a < hi;
      continue;
    }
    if (mine) fn(line);
  }
  std::fclose(f);
  return true;
}
}  // namespace

bool huge_pages_wanted() {
  static const bool on = [] {
    const char* e = std::getenv("DSA_HUGEPAGES");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  return on;
}

void* reserve_huge_aligned(size_t bytes) {
  const size_t page = size_t(::sysconf(_SC_PAGESIZE));
  const size_t size = (std::max<size_t>(bytes, 1) + page - 1) / page * page;
  // kHuge more than needed, then the slack before the first 2 MiB boundary and after the
  // region handed back.
  void* area = ::mmap(nullptr, size + kHuge, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (area == MAP_FAILED) return nullptr;
  const uintptr_t at = (reinterpret_cast<uintptr_t>(area) + kHuge - 1) & ~uintptr_t(kHuge - 1);
  const size_t lead = size_t(at - reinterpret_cast<uintptr_t>(area));
  if (lead) ::munmap(area, lead);
  if (kHuge - lead) ::munmap(reinterpret_cast<void*>(at + size), kHuge - lead);
  return reinterpret_cast<void*>(at);
}

AnonBuffer::AnonBuffer(size_t bytes) {
  const size_t page = size_t(::sysconf(_SC_PAGESIZE));
  const size_t size = (std::max<size_t>(bytes, 1) + page - 1) / page * page;
  void* at = reserve_huge_aligned(size);
  if (!at) return;
  if (::mmap(at, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED) {
    ::munmap(at, size);
    return;
  }
  data_ = static_cast<uint8_t*>(at);
  size_ = size;
#ifdef MADV_HUGEPAGE
  // A hint: refused (THP "never", an old kernel) the buffer stands on small pages.
  if (huge_pages_wanted()) ::madvise(data_, size_, MADV_HUGEPAGE);
#endif
}

void AnonBuffer::release() {
  if (data_) ::munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

AnonBuffer::~AnonBuffer() { release(); }

AnonBuffer::AnonBuffer(AnonBuffer&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}

AnonBuffer& AnonBuffer::operator=(AnonBuffer&& o) noexcept {
  if (this != &o) {
    release();
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

size_t AnonBuffer::huge_bytes() const { return data_ ? smaps_bytes(data_, size_, "AnonHugePages") : 0; }

bool AnonBuffer::huge_advised() const {
  bool advised = false;
  if (data_)
    for_smaps_lines(data_, size_, [&](const char* line) {
      if (std::strncmp(line, "VmFlags:", 8) == 0 && std::strstr(line, " hg")) advised = true;
    });
  return advised;
}

size_t smaps_bytes(const void* p, size_t n, const char* field) {
  const size_t len = std::strlen(field);
  size_t kb = 0;
  for_smaps_lines(p, n, [&](const char* line) {
    size_t v = 0;
    if (std::strncmp(line, field, len) == 0 && line[len] == ':' && std::sscanf(line + len + 1, " %zu kB", &v) == 1) kb += v;
  });
  return kb * 1024;
}

}  // namespace dsa
