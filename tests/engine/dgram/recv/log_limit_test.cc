#include "engine/dgram/recv/log_limit.h"

#include <gtest/gtest.h>

namespace slotstream::dgram {
namespace {

TEST(LogLimiter, PrintsABurstPerWindowAndSaysWhatItLeftOut) {
  LogLimiter l;
  const int64_t w = LogLimiter::kWindowNs;
  for (int i = 0; i < LogLimiter::kBurst; ++i) EXPECT_EQ(l.admit("refused", "line", i), "line");
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(l.admit("refused", "line", 100 + i), std::nullopt);
  EXPECT_EQ(l.suppressed(), 1000u);
  EXPECT_EQ(l.admit("forged", "other kind", 200), "other kind");  // kinds are limited apart
  auto next = l.admit("refused", "line", w + 1);
  ASSERT_TRUE(next);
  EXPECT_NE(next->find("1000 more like it"), std::string::npos);
  EXPECT_EQ(l.admit("refused", "line", w + 2), "line");  // said once
  EXPECT_EQ(l.admit("session", "x", 0, 50), "x");
}

}  // namespace
}  // namespace slotstream::dgram
