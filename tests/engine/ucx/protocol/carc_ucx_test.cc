// carc over real UCX (shared memory and tcp), both halves driven by the test in one process: a
// slow consumer never has more unprocessed bytes than the budget (credit, with the same buffers,
// has them all), the options, and the default budget.
#include "engine/ucx/protocol/carc.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "fabric_pair.h"

namespace slotstream {
namespace {

using testing_support::FabricPair;

class Carc : public testing::TestWithParam<Transport> {};

uint64_t budget_in_setup(const std::vector<uint8_t>& s) {
  uint64_t b = 0;
  for (int i = 0; i < 8; ++i) b |= uint64_t(s[8 + i]) << (8 * i);
  return b;
}

void slow(size_t) { std::this_thread::sleep_for(std::chrono::microseconds(300)); }

TEST_P(Carc, ASlowConsumerNeverHoldsMoreUnprocessedBytesThanTheBudget) {
  FabricPair p;
  const protocol::Geometry g{16, 4096};  // 64 KiB of buffers, a 12 KiB budget
  ASSERT_TRUE(p.open(GetParam(), "carc", "budget=12K", g).is_ok());
  ASSERT_EQ(budget_in_setup(p.rx->setup()), 12u << 10);
  const auto records = testing_support::random_records(300, g.block_size, 3);
  auto o = testing_support::stream(p, records, slow);
  ASSERT_EQ(o.error, "");
  ASSERT_EQ(o.records, records.size());

  EXPECT_LE(o.max_unreleased_bytes, 12u << 10) << "the consumer saw more than the budget at once";
  EXPECT_GE(o.max_unreleased_bytes, 6u << 10) << "the budget was never approached: the test shows nothing";
  auto rs = p.rx->stats().counters;
  EXPECT_LE(rs["max_unreleased_bytes"], 12u << 10);
  EXPECT_EQ(rs["unexpected_messages"], 0u);
  EXPECT_GE(rs["counter_puts"], 1u);
  auto ts = p.tx->stats();
  EXPECT_LE(ts.counters["max_unprocessed_bytes"], 12u << 10);
  EXPECT_GT(ts.counters["budget_waits"], 0u) << "the slow consumer never held the sender back";
  EXPECT_GT(ts.waits, 0u);
  EXPECT_EQ(ts.records, 300u);
}

TEST_P(Carc, CreditWithTheSameBuffersLetsThemAllFillUp) {
  // The contrast: credit bounds messages (16), not bytes.
  FabricPair p;
  const protocol::Geometry g{16, 4096};
  ASSERT_TRUE(p.open(GetParam(), "credit", "", g).is_ok());
  auto records = testing_support::random_records(300, g.block_size, 3);
  auto o = testing_support::stream(p, records, slow);
  ASSERT_EQ(o.records, records.size());
  EXPECT_GT(p.rx->stats().counters["max_unreleased_bytes"], 12u << 10);
}

TEST_P(Carc, ManyBuffersOfSmallMessagesAreLimitedByTheBuffers) {
  FabricPair p;
  const protocol::Geometry g{4, 1024};  // budget far above 4 x 1 KiB: the buffers bind
  ASSERT_TRUE(p.open(GetParam(), "carc", "budget=1M", g).is_ok());
  auto o = testing_support::stream(p, testing_support::random_records(200, g.block_size, 4), slow);
  ASSERT_EQ(o.records, 200u);
  auto ts = p.tx->stats();
  EXPECT_EQ(ts.counters["budget_waits"], 0u);
  EXPECT_GT(ts.counters["buffer_waits"], 0u);
  EXPECT_EQ(p.rx->stats().counters["unexpected_messages"], 0u);
}

TEST_P(Carc, ABudgetBelowOneBlockIsRefusedWithAReason) {
  FabricPair p;
  Status st = p.open(GetParam(), "carc", "budget=2K", {4, 4096});
  EXPECT_EQ(st.code(), Code::kRefused);
  EXPECT_NE(st.message().find("smaller than one block"), std::string::npos) << st.message();
}

TEST_P(Carc, TheDefaultBudgetIsTheCoresCacheShareAndAtLeastOneBlock) {
  const uint64_t share = protocol::cache_share_bytes("/sys/devices/system/cpu/cpu0/cache");
  for (uint32_t block : {4096u, 64u << 20}) {
    FabricPair p;
    ASSERT_TRUE(p.open(GetParam(), "carc", "", {1, block}, /*with_sender=*/false).is_ok());
    const uint64_t want = std::max<uint64_t>(share == 0 ? (2u << 20) : share, block);
    EXPECT_EQ(budget_in_setup(p.rx->setup()), want) << "block " << block;
  }
}

INSTANTIATE_TEST_SUITE_P(Wires, Carc, testing::Values(Transport::kShm, Transport::kTcp),
                         testing_support::wire_case_name);

TEST(CarcOptions, BadOptionsAreRefusedWithTheirName) {
  const protocol::Descriptor* d = protocol::find("carc");
  ASSERT_NE(d, nullptr);
  auto check = [&](const char* text) {
    protocol::Options o;
    Status st = protocol::Options::parse(text, &o);
    return st.is_ok() ? protocol::check_options(*d, o) : st;
  };
  EXPECT_TRUE(check("budget=2M").is_ok());
  EXPECT_TRUE(check("").is_ok());
  for (const char* bad : {"budget=lots", "budget=0", "window=4", "budget=-1"}) {
    Status st = check(bad);
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find(std::string(bad).substr(0, std::string(bad).find('='))), std::string::npos)
        << bad << ": " << st.message();
  }
  const protocol::Descriptor* credit = protocol::find("credit");
  protocol::Options o;
  ASSERT_TRUE(protocol::Options::parse("budget=2M", &o).is_ok());
  EXPECT_EQ(protocol::check_options(*credit, o).code(), Code::kInvalidArgument) << "credit takes no options";
}

}  // namespace
}  // namespace slotstream
