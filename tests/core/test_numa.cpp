#include <gtest/gtest.h>
#include <numa.h>
#include <numaif.h>

#include <string>
#include <thread>

#include "core/error.h"
#include "core/numa.h"

namespace {
int current_policy() {
  int mode = -1;
  EXPECT_EQ(get_mempolicy(&mode, nullptr, 0, nullptr, 0), 0);
  return mode;
}
}  // namespace

TEST(Numa, ParsesTheModesAndNamesThemOnABadOne) {
  EXPECT_EQ(dsa::parse_numa_mode("auto"), dsa::NumaMode::Auto);
  EXPECT_EQ(dsa::parse_numa_mode("off"), dsa::NumaMode::Off);
  EXPECT_EQ(dsa::parse_numa_mode("interleave"), dsa::NumaMode::Interleave);
  EXPECT_EQ(dsa::parse_numa_mode("distribute"), dsa::NumaMode::Interleave);
  try {
    dsa::parse_numa_mode("spread");
    FAIL() << "no error for an unknown mode";
  } catch (const dsa::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'spread'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("auto, off or interleave"), std::string::npos) << e.what();
  }
}

// Interleave sets MPOL_INTERLEAVE on the calling thread, threads created afterwards inherit
// it (the OpenMP workers), and off puts the default policy back.
TEST(Numa, InterleaveReachesNewThreadsAndOffRestoresTheDefault) {
  if (numa_available() < 0) GTEST_SKIP() << "kernel without NUMA support";
  const dsa::NumaStatus st = dsa::numa_setup(dsa::NumaMode::Interleave);
  EXPECT_TRUE(st.interleaved);
  EXPECT_GE(st.nodes, 1);
  EXPECT_EQ(current_policy(), MPOL_INTERLEAVE);
  int worker = -1;
  std::thread([&] { worker = current_policy(); }).join();
  EXPECT_EQ(worker, MPOL_INTERLEAVE);
  EXPECT_TRUE(dsa::numa_status().interleaved);

  EXPECT_FALSE(dsa::numa_setup(dsa::NumaMode::Off).interleaved);
  EXPECT_EQ(current_policy(), MPOL_DEFAULT);
  EXPECT_FALSE(dsa::numa_status().interleaved);
}

// Auto interleaves exactly when the process may allocate on more than one node.
TEST(Numa, AutoInterleavesOnlyWithSeveralNodes) {
  if (numa_available() < 0) GTEST_SKIP() << "kernel without NUMA support";
  dsa::numa_setup(dsa::NumaMode::Off);
  const dsa::NumaStatus st = dsa::numa_setup(dsa::NumaMode::Auto);
  EXPECT_EQ(st.nodes, dsa::numa_nodes());
  EXPECT_EQ(st.interleaved, st.nodes > 1);
  EXPECT_EQ(current_policy(), st.nodes > 1 ? MPOL_INTERLEAVE : MPOL_DEFAULT);
  dsa::numa_setup(dsa::NumaMode::Off);
}

// Auto keeps a policy set from outside (numactl --membind=0 runs the process bound).
TEST(Numa, AutoKeepsAPolicySetFromOutside) {
  if (numa_available() < 0) GTEST_SKIP() << "kernel without NUMA support";
  struct bitmask* mems = numa_get_mems_allowed();
  int first = 0;
  while (!numa_bitmask_isbitset(mems, unsigned(first))) ++first;
  numa_bitmask_free(mems);
  unsigned long mask = 1ul << first;
  ASSERT_EQ(set_mempolicy(MPOL_BIND, &mask, sizeof mask * 8 + 1), 0);
  const dsa::NumaStatus st = dsa::numa_setup(dsa::NumaMode::Auto);
  EXPECT_FALSE(st.interleaved);
  EXPECT_EQ(current_policy(), MPOL_BIND);
  dsa::numa_setup(dsa::NumaMode::Off);
  EXPECT_EQ(current_policy(), MPOL_DEFAULT);
}
