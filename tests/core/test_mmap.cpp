#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

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
