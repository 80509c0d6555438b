// status_byte's sender walk over real UCX (shared memory and tcp), both halves driven by the test in
// one process: with policy=paper (§3.2.4, Fig. 18) the sender waits while the next block in order is
// still full (1), though a later one is free; with policy=any (the default) it takes the free one.
// And a status read started ahead (over tcp) never lets the sender overwrite an unconsumed block.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
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

// Over tcp a status read is a round trip through the receiver's progress thread, so the sender
// starts it as it takes its last free block, before that block's write (read_ahead). The answer
// can predate the write: were the block taken as empty from it, the sender would overwrite a block
// the receiver has not consumed, and a record would arrive twice or never. A slow consumer keeps
// the sender out of blocks most of the time; every record must arrive once, intact.
TEST_P(StatusBytePolicy, EveryRecordArrivesOnceWhileStatusReadsGoAhead) {
  FabricPair p;
  const protocol::Geometry g{3, 2048};
  ASSERT_TRUE(p.open(GetParam(), "status_byte", "", g).is_ok());
  constexpr uint32_t kCount = 400;
  auto records = testing_support::random_records(kCount, g.block_size, 11);
  for (uint32_t i = 0; i < kCount; ++i) {
    records[i].resize(std::max<size_t>(records[i].size(), 4));
    std::memcpy(records[i].data(), &i, 4);
  }
  std::vector<int> seen(kCount, 0);
  std::atomic<bool> corrupt{false};
  std::thread consumer([&] {
    std::vector<protocol::Record> got;
    uint32_t total = 0;
    for (auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
         total < kCount && std::chrono::steady_clock::now() < until;) {
      got.clear();
      p.rx->poll(&got);
      for (const auto& r : got) {
        uint32_t i = 0;
        std::memcpy(&i, r.bytes.data(), 4);
        if (i >= kCount || !std::equal(records[i].begin(), records[i].end(), r.bytes.begin())) {
          corrupt = true;
        } else {
          ++seen[i];
        }
        ++total;
        if (total % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));  // a slow consumer
        p.rx->release(r.id);
      }
    }
  });
  for (uint32_t i = 0; i < kCount; ++i) {
    fabric::Request req;
    Status st = p.tx->transmit_st(records[i].data(), records[i].size(), &req);
    if (st.is_ok()) st = req.wait(*p.tx_worker, [] { return Status::ok(); });
    ASSERT_TRUE(st.is_ok()) << st.to_string();
  }
  ASSERT_TRUE(p.tx->finish_st().is_ok());
  consumer.join();
  EXPECT_FALSE(corrupt) << "a record arrived with bytes not its own";
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), kCount) << "a record arrived twice or never";
  const auto stats = p.tx->stats();
  const uint64_t ahead = stats.counters.count("read_ahead") ? stats.counters.at("read_ahead") : 0;
  std::printf("status reads %llu, of them started ahead %llu\n", (unsigned long long)stats.sync_ops,
              (unsigned long long)ahead);
}

INSTANTIATE_TEST_SUITE_P(Wires, StatusBytePolicy, testing::Values(Transport::kShm, Transport::kTcp),
                         testing_support::wire_case_name);

}  // namespace
}  // namespace slotstream
