#include <gtest/gtest.h>
#include <sched.h>

#include "core/threads.h"

// The default thread count is at least one and never more than the CPUs this process may
// use; with an affinity mask of one CPU it is exactly one.
TEST(Threads, PhysicalCoresWithinTheAffinityMask) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  const int n = dsa::physical_cores();
  EXPECT_GE(n, 1);
  EXPECT_LE(n, CPU_COUNT(&set));

  int first = 0;
  while (!CPU_ISSET(first, &set)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
  EXPECT_EQ(dsa::physical_cores(), 1);
  ASSERT_EQ(sched_setaffinity(0, sizeof set, &set), 0);
}
