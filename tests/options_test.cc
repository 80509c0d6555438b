// The option schema (src/options.cc): stall_timeout's range, with 0 as "off" besides it.
#include "slotstream/options.h"

#include <gtest/gtest.h>

namespace slotstream {
namespace {

using std::chrono::milliseconds;

TEST(OptionSchema, StallTimeoutIsInTheSchemaWithItsUnitAndZeroAsOff) {
  const OptionSpec* s = find_option("stall_timeout");
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->unit, "s");
  EXPECT_EQ(s->min, 2);
  EXPECT_TRUE(s->zero_off);
  EXPECT_FALSE(out_of_range(*s, 0));  // wait for ever
  EXPECT_FALSE(out_of_range(*s, 2));
  EXPECT_FALSE(out_of_range(*s, 30));
  EXPECT_EQ(out_of_range(*s, 0.5), "0.5 s is below the least, 2 s (or 0: off)");
  EXPECT_EQ(out_of_range(*s, -1), "-1 s is below the least, 2 s (or 0: off)");
  EXPECT_TRUE(out_of_range(*s, 86400.0 * 366));
  // An option without zero_off does not take 0 outside its range.
  EXPECT_EQ(out_of_range(*find_option("blocks"), 0), "0 is not in range 1..4096");
}

TEST(OptionSchema, SenderOptionsStallTimeoutIsCheckedOnEveryTransport) {
  for (Transport t : {Transport::kTcp, Transport::kUdp}) {
    SenderOptions o;
    o.transport = t;
    o.stall_timeout = milliseconds(500);
    Status st = check_sender_options(o);
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << transport_name(t);
    EXPECT_EQ(st.message(), "stall_timeout: 0.5 s is below the least, 2 s (or 0: off)") << transport_name(t);
    o.stall_timeout = milliseconds(0);
    EXPECT_TRUE(check_sender_options(o).is_ok()) << transport_name(t) << ": " << check_sender_options(o).message();
    o.stall_timeout = milliseconds(2000);
    EXPECT_TRUE(check_sender_options(o).is_ok()) << transport_name(t);
  }
}

}  // namespace
}  // namespace slotstream
