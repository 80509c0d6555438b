// credit over real UCX (shared memory and tcp), both halves driven by the test in one process:
// the batching of credit updates as the counters show it, and what a sender that ignores its
// credits (sends without a posted receive) or the geometry (a message longer than a buffer)
// does to the receiver.
#include "engine/ucx/protocol/credit.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "fabric_pair.h"

namespace slotstream {
namespace {

using testing_support::FabricPair;

class Credit : public testing::TestWithParam<Transport> {};

TEST_P(Credit, CreditsComeBackInBatchesOfHalfAndEveryRecordArrivesInOrder) {
  FabricPair p;
  const protocol::Geometry g{8, 4096};
  ASSERT_TRUE(p.open(GetParam(), "credit", "", g).is_ok());
  const auto records = testing_support::random_records(203, g.block_size, 1);
  auto o = testing_support::stream(p, records);
  ASSERT_EQ(o.error, "");
  ASSERT_EQ(o.records, records.size());

  auto rs = p.rx->stats().counters;
  EXPECT_EQ(rs["ack_batch"], 4u);
  EXPECT_EQ(rs["credit_updates_sent"], 203u / 4) << "one update per four releases, none per record";
  EXPECT_EQ(rs["unexpected_messages"], 0u) << "credits must keep every message to a posted receive";
  EXPECT_EQ(rs["failed_receives"], 0u);
  EXPECT_LE(rs["max_unreleased_records"], 8u);

  auto ts = p.tx->stats();
  EXPECT_EQ(ts.records, 203u);
  EXPECT_EQ(ts.counters["credits_returned"], 4 * ts.counters["credit_updates"]);
  EXPECT_EQ(ts.counters["max_credits_per_update"], 4u);
  EXPECT_EQ(ts.counters["updates_ignored"], 0u);
  // Record r (from 0) needs r + 1 - 8 credits back: all but the last few updates were used.
  EXPECT_GE(ts.counters["credits_returned"], 203u - 8);
  EXPECT_EQ(ts.sync_ops, ts.counters["credit_updates"]);
}

TEST_P(Credit, ASenderThatIgnoresItsCreditsLosesNothingButIsCounted) {
  FabricPair p;
  const protocol::Geometry g{4, 256};
  ASSERT_TRUE(p.open(GetParam(), "credit", "", g, /*with_sender=*/false).is_ok());
  const uint64_t tag = [&] {
    auto s = p.rx->setup();
    uint64_t t = 0;
    for (int i = 0; i < 8; ++i) t |= uint64_t(s[i]) << (8 * i);
    return t;
  }();
  // Seven messages at once into four posted receives; the third is longer than a buffer.
  auto records = testing_support::random_records(7, g.block_size, 2);
  records[2].resize(g.block_size + 100);
  const auto before = fabric::counters();
  std::vector<fabric::Request> reqs(records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    ASSERT_TRUE(p.tx_endpoint->tag_send(records[i].data(), records[i].size(), tag, &reqs[i]).is_ok());
  }
  // Let every eager send leave before the receiver looks (so it finds more messages than posted
  // receives whatever the machine's load): progress the sender alone until they completed.
  for (const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
       std::chrono::steady_clock::now() < until && std::any_of(reqs.begin(), reqs.end(), [](fabric::Request& r) {
         return r.check().code() == Code::kInProgress;
       });) {
    p.tx_worker->progress();
  }
  // Then the receiver's worker alone, before the protocol reposts anything: UCX reads every message off the
  // transport, and the three beyond the four posted receives wait in its unexpected queue. (Polling at once
  // let UCX's shared-memory transport hand over one message per progress under ThreadSanitizer, each reposted
  // receive catching the next one: no message was ever unexpected, about one run in ten.)
  for (const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
       std::chrono::steady_clock::now() < until;) {
    p.rx_worker->progress();
  }
  std::vector<size_t> got;  // indexes into records, in arrival order
  std::vector<protocol::Record> polled;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (got.size() < 6 && std::chrono::steady_clock::now() < deadline) {
    p.tx_worker->progress();
    p.rx->progress();
    polled.clear();
    p.rx->poll(&polled);
    for (const auto& r : polled) {
      size_t want = got.size() < 2 ? got.size() : got.size() + 1;  // record 2 is lost
      ASSERT_EQ(r.bytes.size(), records[want].size()) << "arrival " << got.size();
      ASSERT_TRUE(std::equal(records[want].begin(), records[want].end(), r.bytes.begin()));
      got.push_back(want);
      p.rx->release(r.id);
    }
  }
  ASSERT_EQ(got.size(), 6u) << "every message but the oversized one, in order";
  auto rs = p.rx->stats().counters;
  // Expect: the oversized one failed its receive (truncated), and the ones sent without a
  // posted receive waited in UCX until one was posted again.
  EXPECT_EQ(rs["failed_receives"], 1u);
  EXPECT_GE(rs["unexpected_messages"], 1u);
  EXPECT_GE(fabric::counters().tag_unexpected - before.tag_unexpected, rs["unexpected_messages"]);
  for (auto& r : reqs) (void)r.wait(*p.tx_worker, [] { return Status::ok(); });
}

INSTANTIATE_TEST_SUITE_P(Wires, Credit, testing::Values(Transport::kShm, Transport::kTcp),
                         testing_support::wire_case_name);

}  // namespace
}  // namespace slotstream
