// status_byte's sender walk over real UCX (shared memory and tcp), both halves driven by the test in
// one process: with policy=paper (§3.2.4, Fig. 18) the sender waits while the next block in order is
// still full (1), though a later one is free; with policy=any (the default) it takes the free one.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "fabric_pair.h"

namespace slotstream {
namespace {

using testing_support::FabricPair;

class StatusBytePolicy : public testing::TestWithParam<Transport> {
 protected:
  // Three blocks written; the receiver consumes blocks 1 and 2 but keeps block 0 full (status 1).
  // Returns the fourth record's block and whether its transmit had to wait for block 0's release.
  void fourth_record(const std::string& options, uint32_t* slot, bool* waited, uint64_t* paper_waits) {
    FabricPair p;
    const protocol::Geometry g{3, 1024};
    ASSERT_TRUE(p.open(GetParam(), "status_byte", options, g).is_ok());
    const auto records = testing_support::random_records(4, g.block_size, 7);
    for (int i = 0; i < 3; ++i) {
      fabric::Request req;
      ASSERT_TRUE(p.tx->transmit_st(records[i].data(), records[i].size(), &req).is_ok());
      ASSERT_TRUE(req.wait(*p.tx_worker, [] { return Status::ok(); }).is_ok());
    }
    std::vector<protocol::Record> got;
    for (auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
         got.size() < 3 && std::chrono::steady_clock::now() < until;) {
      got.clear();
      p.rx->poll(&got);
    }
    ASSERT_EQ(got.size(), 3u);
    p.rx->release(1);
    p.rx->release(2);
    std::atomic<bool> done{false};
    Status sent;
    std::thread sender([&] {
      fabric::Request req;
      sent = p.tx->transmit_st(records[3].data(), records[3].size(), &req);
      if (sent.is_ok()) sent = req.wait(*p.tx_worker, [] { return Status::ok(); });
      done = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    *waited = !done.load();
    p.rx->release(0);  // block 0 consumed at last
    sender.join();
    ASSERT_TRUE(sent.is_ok()) << sent.to_string();
    got.clear();
    for (auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
         got.empty() && std::chrono::steady_clock::now() < until;) {
      p.rx->poll(&got);
    }
    ASSERT_EQ(got.size(), 1u);
    ASSERT_TRUE(std::equal(records[3].begin(), records[3].end(), got[0].bytes.begin()));
    *slot = got[0].slot;
    *paper_waits = p.tx->stats().counters["paper_full_waits"];
  }
};

TEST_P(StatusBytePolicy, PaperWaitsWhileTheNextBlockIsFullThoughALaterOneIsFree) {
  uint32_t slot = 9;
  bool waited = false;
  uint64_t paper_waits = 0;
  fourth_record("policy=paper", &slot, &waited, &paper_waits);
  EXPECT_TRUE(waited) << "policy=paper wrote past a full next block";
  EXPECT_EQ(slot, 0u) << "policy=paper: block 0 is next in order";
  EXPECT_GE(paper_waits, 1u);
}

TEST_P(StatusBytePolicy, AnyTakesTheNextFreeBlockAtOnce) {
  uint32_t slot = 9;
  bool waited = true;
  uint64_t paper_waits = 9;
  fourth_record("", &slot, &waited, &paper_waits);
  EXPECT_FALSE(waited) << "policy=any waited for a full block while others were free";
  EXPECT_EQ(slot, 1u);
  EXPECT_EQ(paper_waits, 0u);
}

INSTANTIATE_TEST_SUITE_P(Wires, StatusBytePolicy, testing::Values(Transport::kShm, Transport::kTcp),
                         testing_support::wire_case_name);

}  // namespace
}  // namespace slotstream
