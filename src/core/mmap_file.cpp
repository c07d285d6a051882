#include "core/mmap_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>

#include "core/error.h"
#include "core/huge_pages.h"

namespace dsa {

namespace {

// Opens a regular file for reading; label names it in the errors ("'p'", "hardware profile
// 'p'"). O_NONBLOCK: opening a FIFO must not wait for a writer (it is rejected instead).
int open_regular(const std::string& path, const std::string& label, struct stat& st) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw Error("cannot open " + label + ": " + std::strerror(errno));
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(label + " is not a regular file");
  }
  return fd;
}

// Maps the file read-only at a multiple of 2 MiB, so that the mapping's addresses line up
// with the file's offsets modulo 2 MiB: the condition for the kernel to map a 2 MiB folio
// of the page cache with one TLB entry. Falls back to wherever the kernel puts it.
void* map_aligned(int fd, size_t size) {
  auto anywhere = [&] { return ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0); };
  void* at = reserve_huge_aligned(size);
  if (!at) return anywhere();
  void* p = ::mmap(at, size, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0);
  if (p == MAP_FAILED) {
    ::munmap(at, size);
    return anywhere();
  }
#ifdef MADV_HUGEPAGE
  // Pages read in through this mapping come as 2 MiB folios where the file system can hold
  // them so. A hint: refused or ignored, the mapping stands.
  if (huge_pages_wanted()) ::madvise(p, size, MADV_HUGEPAGE);
#endif
  return p;
}

}  // namespace

MmapFile::MmapFile(const std::string& path) : path_(path) {
  struct stat st{};
  const int fd = open_regular(path, "'" + path + "'", st);
  size_ = size_t(st.st_size);
  if (size_ > 0) {
    void* p = map_aligned(fd, size_);
    if (p == MAP_FAILED) {
      ::close(fd);
      throw Error("cannot mmap '" + path + "': " + std::strerror(errno));
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
}

std::string read_text_file(const std::string& path, const std::string& what, size_t max_bytes) {
  struct stat st{};
  const int fd = open_regular(path, what + " '" + path + "'", st);
  if (size_t(st.st_size) > max_bytes) {
    ::close(fd);
    throw Error(what + " '" + path + "' is " + std::to_string(st.st_size) + " bytes, more than the " +
                std::to_string(max_bytes) + " expected");
  }
  std::string s(size_t(st.st_size), '\0');
  size_t got = 0;
  while (got < s.size()) {
    const ssize_t n = ::read(fd, s.data() + got, s.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      throw Error("cannot read " + what + " '" + path + "': " + (n == 0 ? "file shrank while reading" : std::strerror(err)));
    }
    got += size_t(n);
  }
  ::close(fd);
  return s;
}

void MmapFile::populate() const { populate(data_, size_); }

void MmapFile::populate(const uint8_t* p, size_t n) const {
  if (!data_ || n == 0) return;
  DSA_CHECK(p >= data_ && p + n <= data_ + size_, "MmapFile::populate: range outside the mapping of " + path_);
  // madvise wants a page-aligned start.
  const size_t page = size_t(::sysconf(_SC_PAGESIZE));
  const size_t lead = size_t(p - data_) % page;
  uint8_t* start = const_cast<uint8_t*>(p - lead);
  const size_t len = n + lead;
#ifdef MADV_POPULATE_READ
  if (::madvise(start, len, MADV_POPULATE_READ) == 0) return;
#endif
  // Kernels before 5.14: start readahead, then touch one byte per page.
  ::madvise(start, len, MADV_WILLNEED);
  volatile uint8_t sink = 0;
  for (size_t i = 0; i < len; i += page) sink = sink ^ start[i];
  (void)sink;
}

size_t MmapFile::huge_bytes() const { return data_ ? smaps_bytes(data_, size_, "FilePmdMapped") : 0; }

// Reads [off, off + len) (2 MiB aligned) of the file in again: unmaps it here, asks the page
// cache to drop it (pages other processes map stay) and maps it again, reading what was
// dropped.
void MmapFile::reread(size_t off, size_t len) const {
  uint8_t* p = const_cast<uint8_t*>(data_) + off;
  ::madvise(p, len, MADV_DONTNEED);  // a private read-only mapping: drops the page table entries only
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ::posix_fadvise(fd, off_t(off), off_t(len), POSIX_FADV_DONTNEED);
    ::close(fd);
  }
  populate(p, len);
}

void MmapFile::populate_huge() const {
  populate();
  constexpr size_t kTrial = size_t(64) << 20;
  // Set once a trial came back in 4 KiB pages: this kernel or file system does not hold
  // files in 2 MiB folios, and the other files of a checkpoint are not tried.
  static std::atomic<bool> futile{false};
  if (!huge_pages_wanted() || futile || size_ < 2 * kTrial || huge_bytes() >= size_ / 2) return;
  // Mostly 4 KiB pages: the file was written or copied lately, and its pages stayed in the
  // cache as they were written. Read the first 64 MiB in again; if they come back as 2 MiB
  // folios (the file system can hold them so), read in the rest too, once.
  const size_t before = huge_bytes();
  reread(0, kTrial);
  if (huge_bytes() < before + kTrial / 2) {
    futile = true;
    return;
  }
  reread(kTrial, size_ - kTrial);
}

MmapFile::~MmapFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

MmapFile::MmapFile(MmapFile&& o) noexcept
    : path_(std::move(o.path_)), data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}

MmapFile& MmapFile::operator=(MmapFile&& o) noexcept {
  if (this != &o) {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
    path_ = std::move(o.path_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

}  // namespace dsa
