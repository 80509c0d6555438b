// Puts and gets over tcp as the fabric carries them (src/engine/ucx/fabric/soft_rma.h), over real UCX in one
// process: an initiator worker driven by the test, a target worker with a progress thread.
#include "engine/ucx/fabric/soft_rma.h"

#include "loopback.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

namespace slotstream::fabric {
namespace {

TEST(Context, NeedsAConcreteTransport) {
  std::unique_ptr<Context> ctx;
  Status st = Context::create(Transport::kAuto, &ctx);
  EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.to_string();
  EXPECT_EQ(ctx, nullptr);
}

class SoftRmaTest : public Loopback {
 protected:
  void SetUp() override {
    open(Transport::kTcp);
    for (size_t i = 0; i < kRegion; ++i) region_->data()[i] = std::byte(i * 13 + 1);
  }
};

TEST_F(SoftRmaTest, AGetLargerThanOneReplyChunkArrivesWhole) {
  serve();
  std::vector<std::byte> dst(kRegion - 3);
  Request r;
  ASSERT_TRUE(ep_->get(dst.data(), dst.size(), region_->remote_address() + 3, *rkey_, &r).is_ok());
  ASSERT_TRUE(wait(r).is_ok());
  EXPECT_EQ(std::memcmp(dst.data(), region_->data() + 3, dst.size()), 0);
}

TEST_F(SoftRmaTest, APutIsAppliedWhenFlushReturns) {
  serve();
  const char text[] = "written by a put";
  Request r;
  ASSERT_TRUE(ep_->put(text, sizeof text, region_->remote_address() + 100, *rkey_, &r).is_ok());
  ASSERT_TRUE(wait(r).is_ok());
  ASSERT_TRUE(ep_->flush([] { return Status::ok(); }).is_ok());
  EXPECT_EQ(std::memcmp(region_->data() + 100, text, sizeof text), 0) << "flush returned before the put landed";
}

// Progresses the initiator for up to `for_ms` (and `drive` each turn, when given): the get's status then.
Status settle(Worker& initiator, Request& r, int for_ms, ProgressThread::Driver* drive = nullptr) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(for_ms);
  Status st = r.check();
  while (st.code() == Code::kInProgress && std::chrono::steady_clock::now() < until) {
    initiator.progress();
    if (drive != nullptr) drive->poll();
    st = r.check();
  }
  return st;
}

// A receiver's consumer that polls the worker itself (ReceiverSession::consume) takes the progress
// thread's place: while it polls, the thread is not woken for the peer's messages (a thread that
// ignored Drivers would wait for events once per read here); once it lets go the thread serves again.
TEST_F(SoftRmaTest, AProgressThreadStandsDownWhileADriverPolls) {
  serve();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the progress thread waits for events
  std::vector<std::byte> dst(64);
  int reads = 0;
  uint64_t turns = 0;
  {
    ProgressThread::Driver drive(progress_.get());
    drive.poll();  // takes over
    turns = progress_->turns();
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    for (; reads < 1000 && std::chrono::steady_clock::now() < until; ++reads) {
      Request r;
      ASSERT_TRUE(ep_->get(dst.data(), dst.size(), region_->remote_address() + reads % 512, *rkey_, &r).is_ok());
      ASSERT_TRUE(settle(*initiator_, r, 5000, &drive).is_ok()) << "the driver's own polls serve the read";
      ASSERT_EQ(std::memcmp(dst.data(), region_->data() + reads % 512, dst.size()), 0);
    }
    turns = progress_->turns() - turns;
  }  // lets go
  // Ignoring Drivers, it waited 95 times in 1,000 reads here (the Driver's polls win most races); standing
  // down, only where the test thread was off its core for longer than kDriverLook.
  EXPECT_GE(reads, 200);
  EXPECT_LE(turns, uint64_t(reads / 50)) << "the progress thread waited for events " << turns << " times in " << reads
                                         << " reads";
  std::fill(dst.begin(), dst.end(), std::byte{0});
  Request r;
  ASSERT_TRUE(ep_->get(dst.data(), dst.size(), region_->remote_address() + 64, *rkey_, &r).is_ok());
  ASSERT_TRUE(settle(*initiator_, r, 5000).is_ok()) << "the progress thread serves again once the driver let go";
  EXPECT_EQ(std::memcmp(dst.data(), region_->data() + 64, dst.size()), 0);
}

// A Driver that holds the worker but stops polling (a consumer busy in its sink's write) leaves no
// peer waiting: the progress thread finds no poll since its last look and serves the read itself.
TEST_F(SoftRmaTest, AProgressThreadServesWhileItsDriverIsBusyElsewhere) {
  serve();
  std::vector<std::byte> dst(64);
  ProgressThread::Driver drive(progress_.get());
  drive.poll();  // takes over, then polls no more
  Request r;
  ASSERT_TRUE(ep_->get(dst.data(), dst.size(), region_->remote_address(), *rkey_, &r).is_ok());
  ASSERT_TRUE(settle(*initiator_, r, 5000).is_ok()) << "the read waited for a driver that does not poll";
  EXPECT_EQ(std::memcmp(dst.data(), region_->data(), dst.size()), 0);
}

TEST_F(SoftRmaTest, TheMessagesThatCarryAGetAreCounted) {
  serve();
  std::vector<std::byte> dst(64);
  reset_counters();
  Request r;
  ASSERT_TRUE(ep_->get(dst.data(), dst.size(), region_->remote_address(), *rkey_, &r).is_ok());
  ASSERT_TRUE(wait(r).is_ok());
  const Counters c = counters();
  EXPECT_EQ(c.gets, 1u);
  // The request and its reply, each sent by one worker and handled by the other (one process).
  EXPECT_GE(c.am_sends, 2u);
  EXPECT_GE(c.am_received, 2u);
}

TEST_F(SoftRmaTest, ReadingOrWritingOutsideRegisteredMemoryIsRefusedNotServed) {
  serve();
  std::vector<std::byte> dst(64, std::byte{0x55});
  Request r;
  // One byte past the end of the only region.
  ASSERT_TRUE(ep_->get(dst.data(), 64, region_->remote_address() + kRegion - 63, *rkey_, &r).is_ok());
  Status st = wait(r);
  EXPECT_EQ(st.code(), Code::kProtocolError) << st.to_string();
  EXPECT_EQ(dst[0], std::byte{0x55}) << "a refused read wrote its destination";
  // A write there is dropped by the target (the flush behind it still completes).
  uint64_t guard = 0;
  std::memcpy(&guard, region_->data() + kRegion - 8, 8);
  const char text[16] = "out of bounds!!";
  Request w;
  ASSERT_TRUE(ep_->put(text, sizeof text, region_->remote_address() + kRegion - 8, *rkey_, &w).is_ok());
  ASSERT_TRUE(wait(w).is_ok());
  ASSERT_TRUE(ep_->flush([] { return Status::ok(); }).is_ok());
  uint64_t after = 0;
  std::memcpy(&after, region_->data() + kRegion - 8, 8);
  EXPECT_EQ(after, guard);
}

TEST_F(SoftRmaTest, ARegionIsNotReleasedWhileAPeersWriteHoldsTheRegistrations) {
  // The target checks a put against the registrations and writes it under one hold (soft_rma.cc): a region whose
  // owner lets go meanwhile (a receiver that stops) leaves them only after the write, never between the check and
  // it — that wrote into unmapped memory.
  const uint64_t address = region_->remote_address();
  std::atomic<bool> released{false};
  auto hold = ctx_->hold_registrations();
  ASSERT_TRUE(ctx_->registered_held(address, kRegion));
  std::thread owner([&] {
    region_.reset();
    released.store(true);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(released.load()) << "the region was released while a write held the registrations";
  EXPECT_TRUE(ctx_->registered_held(address, kRegion));
  hold.unlock();
  owner.join();
  EXPECT_TRUE(released.load());
  EXPECT_FALSE(ctx_->registered(address, 1)) << "a released region is still registered";
}

TEST_F(SoftRmaTest, PutsThatRaceTheirRegionsReleaseNeverWriteUnmappedMemory) {
  // A receiver that stops frees its blocks while a sender's puts still arrive: each round releases a region
  // while the target's progress thread is still writing the puts into it. Those that arrive after it went are
  // refused; none may write into the memory once it is unmapped (before the hold: SIGSEGV within a few rounds).
  serve();
  std::vector<std::byte> block(256 << 10, std::byte{7});
  constexpr int kPuts = 16;
  for (int round = 0; round < 40; ++round) {
    std::unique_ptr<MemoryRegion> r;
    ASSERT_TRUE(MemoryRegion::allocate(*ctx_, kPuts * block.size(), &r).is_ok());
    std::vector<Request> puts(kPuts);
    for (int i = 0; i < kPuts; ++i) {
      ASSERT_TRUE(
          ep_->put(block.data(), block.size(), r->remote_address() + i * block.size(), *rkey_, &puts[i]).is_ok());
    }
    initiator_->progress();
    r.reset();  // while the target is still placing them
    for (auto& p : puts) ASSERT_TRUE(wait(p).is_ok());
  }
  ASSERT_TRUE(flush().is_ok());
}

TEST_F(SoftRmaTest, AReplyQueuedForASlowReaderKeepsItsRegionMappedPastItsRelease) {
  // A receiver that stops releases its blocks while the reply to its peer's read still waits in UCX's queue (the
  // peer reads slowly, or not at all): the queued chunks must leave from memory that is still mapped, with the bytes
  // it had. Unmapped at once, they were read from unmapped memory.
  constexpr size_t kBig = 64 << 20;  // far more than a loopback socket's buffers hold
  std::unique_ptr<MemoryRegion> big;
  ASSERT_TRUE(MemoryRegion::allocate(*ctx_, kBig, &big).is_ok());
  auto pattern = [](size_t i) { return std::byte((i * 13 + (i >> 12)) & 0xff); };
  for (size_t i = 0; i < kBig; ++i) big->data()[i] = pattern(i);
  std::vector<uint8_t> packed;
  ASSERT_TRUE(big->pack_rkey(&packed).is_ok());
  std::unique_ptr<RemoteKey> key;
  ASSERT_TRUE(RemoteKey::unpack(*ep_, packed, &key).is_ok());
  serve();
  reset_counters();
  std::vector<std::byte> dst(kBig);
  Request r;
  ASSERT_TRUE(ep_->get(dst.data(), kBig, big->remote_address(), *key, &r).is_ok());
  // Until the target has the request; then the initiator reads nothing for a while and the reply backs up.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (counters().am_received == 0 && std::chrono::steady_clock::now() < until) initiator_->progress();
  ASSERT_GT(counters().am_received, 0u) << "the target never got the read";
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const uint64_t address = big->remote_address();
  big.reset();
  EXPECT_EQ(ctx_->unmaps_waiting(), 1u) << "released while its reply was queued, and unmapped at once";
  EXPECT_FALSE(ctx_->registered(address, 1)) << "a released region still serves reads";
  ASSERT_TRUE(wait(r).is_ok());
  size_t wrong = 0;
  for (size_t i = 0; i < kBig; ++i) wrong += dst[i] != pattern(i);
  EXPECT_EQ(wrong, 0u) << "bytes of the reply differ from the region's";
  const auto unmapped_by = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (ctx_->unmaps_waiting() != 0 && std::chrono::steady_clock::now() < unmapped_by) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(ctx_->unmaps_waiting(), 0u) << "the region stayed mapped after its reply was sent";
}

TEST_F(SoftRmaTest, ADroppedGetNeverWritesItsDestination) {
  // The target is not progressed yet: the get cannot be answered before it is dropped.
  std::vector<std::byte> dst(4096, std::byte{0});
  {
    Request r;
    ASSERT_TRUE(ep_->get(dst.data(), dst.size(), region_->remote_address(), *rkey_, &r).is_ok());
    ASSERT_TRUE(r.pending());
  }  // dropped
  serve();
  for (int i = 0; i < 2000; ++i) {
    initiator_->progress();
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  EXPECT_EQ(dst[0], std::byte{0}) << "the late reply was written into a dropped get's destination";
  // The endpoint still works afterwards.
  Request again;
  ASSERT_TRUE(ep_->get(dst.data(), dst.size(), region_->remote_address(), *rkey_, &again).is_ok());
  ASSERT_TRUE(wait(again).is_ok());
  EXPECT_EQ(std::memcmp(dst.data(), region_->data(), dst.size()), 0);
}

// A read nobody answers while its peer stays alive (a response a NIC lost; here: a target worker that
// nobody progresses) ends after the worker's read timeout, with an error that says so, instead of a wait
// for ever; a read answered late but within it completes.
TEST_F(SoftRmaTest, AGetNothingAnswersEndsAfterTheWorkersReadTimeout) {
  constexpr auto kLimit = std::chrono::milliseconds(300);
  initiator_->set_read_timeout(kLimit);
  std::vector<std::byte> dst(64, std::byte{0});
  {
    Request r;
    ASSERT_TRUE(ep_->get(dst.data(), dst.size(), region_->remote_address(), *rkey_, &r).is_ok());
    const auto t0 = std::chrono::steady_clock::now();
    const Status st = wait(r);  // the peer is alive: the liveness says ok throughout
    const auto waited = std::chrono::steady_clock::now() - t0;
    EXPECT_EQ(st.code(), Code::kTransportError) << st.to_string();
    EXPECT_NE(st.message().find("has not answered a read of the peer's memory"), std::string::npos) << st.to_string();
    EXPECT_GE(waited, kLimit);
    EXPECT_LT(waited, std::chrono::seconds(10)) << "the limit did not end the wait in time";
    EXPECT_TRUE(r.pending()) << "the wait gave up; the request is dropped here";
  }
  // Answered late (100 ms) but well within the limit (5 s here, so that a loaded host's scheduling
  // cannot reach it): not cut off.
  initiator_->set_read_timeout(std::chrono::seconds(5));
  std::thread late([this] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    serve();
  });
  Request again;
  ASSERT_TRUE(ep_->get(dst.data(), dst.size(), region_->remote_address(), *rkey_, &again).is_ok());
  const Status st = wait(again);
  late.join();
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(std::memcmp(dst.data(), region_->data(), dst.size()), 0);
}

TEST_F(SoftRmaTest, AGetToAWorkerThatWentAwayFailsInsteadOfHanging) {
  std::vector<std::byte> dst(64);
  Request r;
  ASSERT_TRUE(ep_->get(dst.data(), dst.size(), region_->remote_address(), *rkey_, &r).is_ok());
  target_.reset();  // its sockets close: the initiator's endpoint fails
  const Status st = settle(*initiator_, r, 20000);
  EXPECT_NE(st.code(), Code::kInProgress) << "still waiting for a reply from a worker that is gone";
  EXPECT_FALSE(st.is_ok());
}

}  // namespace
}  // namespace slotstream::fabric
