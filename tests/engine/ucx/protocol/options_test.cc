// Protocol options (`--protocol NAME:key=value,...`): typed reads.
#include "engine/ucx/protocol/options.h"

#include <gtest/gtest.h>

namespace slotstream::protocol {
namespace {

TEST(Options, ChoiceTakesOnlyTheListedValues) {
  Options o;
  ASSERT_TRUE(Options::parse("flush=idle", &o).is_ok());
  std::string v;
  ASSERT_TRUE(o.choice("flush", {"call", "idle"}, "call", &v).is_ok());
  EXPECT_EQ(v, "idle");
  ASSERT_TRUE(o.choice("other", {"a", "b"}, "a", &v).is_ok());
  EXPECT_EQ(v, "a") << "absent: the fallback";
  ASSERT_TRUE(Options::parse("flush=sometimes", &o).is_ok());
  Status st = o.choice("flush", {"call", "idle"}, "call", &v);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("call|idle"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace slotstream::protocol
