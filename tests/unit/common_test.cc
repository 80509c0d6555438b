// Small public helpers (src/common.cc): sizes as people write them.
#include <unistd.h>

#include <gtest/gtest.h>

#include "common.h"
#include "slotstream/slotstream.h"

namespace slotstream {
namespace {

TEST(ParseSize, PlainNumbersAndBinaryUnits) {
  EXPECT_EQ(parse_size("0"), 0u);
  EXPECT_EQ(parse_size("65536"), 65536u);
  EXPECT_EQ(parse_size("12B"), 12u);
  EXPECT_EQ(parse_size("64K"), 64u << 10);
  EXPECT_EQ(parse_size("64KiB"), 64u << 10);
  EXPECT_EQ(parse_size("64kb"), 64u << 10);
  EXPECT_EQ(parse_size("2M"), 2u << 20);
  EXPECT_EQ(parse_size("4G"), uint64_t(4) << 30);
  EXPECT_EQ(parse_size("1TiB"), uint64_t(1) << 40);
}

TEST(ParseSize, RejectsWhatIsNotASize) {
  for (const char* bad : {"", "M", "-5M", "1.5G", "12Q", "4 G", "4GiBs", "4Gi", "18446744073709551616",
                          "17179869184G"}) {
    EXPECT_FALSE(parse_size(bad).has_value()) << bad;
  }
}

TEST(FormatBytes, PicksTheLargestUnitBelow1024) {
  EXPECT_EQ(format_bytes(12), "12 B");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(uint64_t(256) << 30), "256.0 GiB");
}

TEST(DefaultMaxMemory, IsAQuarterOfMemoryAtMost) {
  const uint64_t budget = default_max_memory();
  EXPECT_GT(budget, 0u);
  EXPECT_LE(budget, uint64_t(sysconf(_SC_PHYS_PAGES)) * uint64_t(sysconf(_SC_PAGESIZE)) / 4);
}

}  // namespace
}  // namespace slotstream
