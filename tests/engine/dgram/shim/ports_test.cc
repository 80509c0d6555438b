#include "engine/dgram/shim/ports.h"

#include <gtest/gtest.h>

namespace slotstream::dgram {
namespace {

TEST(PortSet, DefaultIsEverythingButDns) {
  PortSet p;
  EXPECT_TRUE(p.applies(40000, 5000));
  EXPECT_TRUE(p.applies(0, 1));
  EXPECT_FALSE(p.applies(40000, 53));  // a name lookup
  EXPECT_FALSE(p.applies(53, 40000));  // a name server's answer
}

TEST(PortSet, ParsesRangesAndSinglesOnEitherEnd) {
  PortSet p;
  std::string err;
  ASSERT_TRUE(PortSet::parse("5000-5999,8000", &p, &err)) << err;
  EXPECT_TRUE(p.applies(40000, 5000));
  EXPECT_TRUE(p.applies(5999, 40000));
  EXPECT_TRUE(p.applies(0, 8000));
  EXPECT_FALSE(p.applies(40000, 4999));
  EXPECT_FALSE(p.applies(6000, 40000));
  EXPECT_FALSE(p.applies(0, 0));
  ASSERT_TRUE(PortSet::parse("all", &p, &err));
  EXPECT_TRUE(p.applies(53, 53));
  ASSERT_TRUE(PortSet::parse("", &p, &err));
  EXPECT_FALSE(p.applies(1, 53));
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
