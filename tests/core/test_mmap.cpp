#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/huge_pages.h"
#include "core/mmap_file.h"
#include "fixtures.h"

namespace {

// Kilobytes of this process's resident pages inside [begin, end): the Rss lines of the
// /proc/self/smaps entries that overlap it (a mapping's pages count once they are mapped
// into this process, whether or not the page cache already held them).
long resident_kb(const uint8_t* begin, const uint8_t* end) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  long kb = 0;
  while (std::getline(smaps, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2) {  // an entry's header: its address range
      inside = lo < reinterpret_cast<uintptr_t>(end) && hi > reinterpret_cast<uintptr_t>(begin);
      continue;
    }
    long v = 0;
    if (inside && std::sscanf(line.c_str(), "Rss: %ld kB", &v) == 1) kb += v;
  }
  return kb;
}

}  // namespace

// populate() maps every page of the file into the process up front; before it, a fresh
// mapping holds none (the loader calls it so that the first tokens take no page faults).
TEST(MmapFile, PopulateMapsEveryPage) {
  const std::filesystem::path path = dsa::test::scratch("mmap");
  const size_t bytes = size_t(8) << 20;
  {
    std::ofstream out(path, std::ios::binary);
    std::vector<char> block(size_t(1) << 20, 'x');
    for (size_t i = 0; i < bytes; i += block.size()) out.write(block.data(), std::streamsize(block.size()));
  }
  {
    dsa::MmapFile f(path.string());
    ASSERT_EQ(f.size(), bytes);
    EXPECT_LT(resident_kb(f.data(), f.data() + f.size()), 1024);  // at most a little readahead
    f.populate();
    EXPECT_GE(resident_kb(f.data(), f.data() + f.size()), long(bytes / 1024));
    EXPECT_EQ(f.data()[bytes - 1], 'x');
  }
  std::filesystem::remove(path);
}

// The mapping starts on a 2 MiB boundary (so that the kernel can map the page cache's 2 MiB
// folios whole), and populate_huge(), which on a file just written (its pages cached as
// they were written) drops the file's pages and reads it again, leaves every byte as the
// file holds it, maps every page, and reports no more huge bytes than the file has.
TEST(MmapFile, PopulateHugeKeepsTheBytesAndMapsEveryPage) {
  const std::filesystem::path path = dsa::test::scratch("mmap_huge");
  const size_t bytes = (size_t(130) << 20) + 12345;  // above the 128 MiB from which it reads again; a ragged end
  auto at = [](size_t i) { return uint8_t((i * 2654435761u) >> 13); };
  {
    std::ofstream out(path, std::ios::binary);
    std::vector<char> block(size_t(1) << 20);
    for (size_t i = 0; i < bytes; i += block.size()) {
      const size_t n = std::min(block.size(), bytes - i);
      for (size_t j = 0; j < n; ++j) block[j] = char(at(i + j));
      out.write(block.data(), std::streamsize(n));
    }
  }
  {
    dsa::MmapFile f(path.string());
    ASSERT_EQ(f.size(), bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(f.data()) % (size_t(2) << 20), 0u);
    f.populate_huge();
    EXPECT_GE(resident_kb(f.data(), f.data() + f.size()), long(bytes / 1024));
    EXPECT_LE(f.huge_bytes(), bytes);
    for (size_t i = 0; i < bytes; i += 4093) ASSERT_EQ(f.data()[i], at(i)) << "byte " << i;
    EXPECT_EQ(f.data()[bytes - 1], at(bytes - 1));
  }
  std::filesystem::remove(path);
}

// AnonBuffer: zeroed, writable, at a 2 MiB boundary, advised for 2 MiB pages (the flag the
// kernel records whether or not it finds a 2 MiB page to give), and unmapped once; a move
// hands the mapping over.
TEST(AnonBuffer, IsZeroedAlignedAndAdvisedForHugePages) {
  const size_t bytes = (size_t(5) << 20) + 100;  // a ragged size: rounded up to whole pages
  dsa::AnonBuffer b(bytes);
  ASSERT_NE(b.data(), nullptr);
  EXPECT_GE(b.size(), bytes);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % (size_t(2) << 20), 0u);
  for (size_t i = 0; i < bytes; i += 4093) ASSERT_EQ(b.data()[i], 0) << "byte " << i;
  std::fill(b.data(), b.data() + bytes, uint8_t(7));
  EXPECT_EQ(b.data()[bytes - 1], 7);
  EXPECT_EQ(b.huge_advised(), dsa::huge_pages_wanted());
  EXPECT_LE(b.huge_bytes(), b.size());
  uint8_t* p = b.data();
  dsa::AnonBuffer moved(std::move(b));
  EXPECT_EQ(b.data(), nullptr);
  EXPECT_EQ(b.size(), 0u);
  EXPECT_EQ(moved.data(), p);
  EXPECT_EQ(moved.data()[0], 7);
  moved = dsa::AnonBuffer(1);
  EXPECT_EQ(resident_kb(p, p + bytes), 0) << "the first mapping is still there";
  EXPECT_EQ(moved.data()[0], 0);
}
