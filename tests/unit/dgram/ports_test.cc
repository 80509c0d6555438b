#include "dgram/shim/ports.h"

#include <gtest/gtest.h>

namespace slotstream::dgram {
namespace {

TEST(PortSet, DefaultIsEverythingButDns) {
  PortSet p;
  EXPECT_TRUE(p.contains(5000));
  EXPECT_TRUE(p.contains(1));
  EXPECT_TRUE(p.contains(65535));
  EXPECT_FALSE(p.contains(53));
}

TEST(PortSet, ParsesRangesAndSingles) {
  PortSet p;
  std::string err;
  ASSERT_TRUE(PortSet::parse("5000-5999,8000", &p, &err)) << err;
  EXPECT_TRUE(p.contains(5000));
  EXPECT_TRUE(p.contains(5999));
  EXPECT_TRUE(p.contains(8000));
  EXPECT_FALSE(p.contains(4999));
  EXPECT_FALSE(p.contains(6000));
  EXPECT_FALSE(p.contains(53));
  ASSERT_TRUE(PortSet::parse("all", &p, &err));
  EXPECT_TRUE(p.contains(53));
}

TEST(PortSet, RejectsNonsense) {
  PortSet p;
  std::string err;
  for (const char* bad : {"x", "5000-", "-5", "6000-5000", "70000", "0", "1,,2", "5000 "}) {
    EXPECT_FALSE(PortSet::parse(bad, &p, &err)) << bad;
    EXPECT_NE(err.find("SLOTSTREAM_UDP_PORTS"), std::string::npos);
  }
}

}  // namespace
}  // namespace slotstream::dgram
