// Delivery over a fake in-memory block array: pure stream logic, no UCX.
#include "engine/ucx/stream/delivery.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <string>
#include <thread>

#include "wire/block_header.h"

namespace slotstream::stream {
namespace {

constexpr uint32_t kBlockSize = 64;  // 48 bytes of payload per block

class FakeBlocks : public protocol::ReceiverProtocol {
 public:
  explicit FakeBlocks(uint32_t n) : data_(n * kBlockSize), status_(n, 0) {}
  std::vector<uint8_t> setup() const override { return {}; }
  void poll(std::vector<protocol::Record>* out) override {
    for (uint32_t i = 0; i < status_.size(); ++i) {
      if (status_[i] == 1) out->push_back({i, i, block(i)});
    }
  }
  std::span<std::byte> block(uint32_t i) { return {data_.data() + i * kBlockSize, kBlockSize}; }
  void release(uint64_t i) override { status_[i] = 0; }
  uint64_t max_records() const override { return status_.size(); }

  // What a sender's put + status byte would leave behind.
  void put(uint32_t index, uint16_t device, uint32_t packet, uint8_t flags, const std::string& payload) {
    wire::encode_block_header({flags, device, packet, uint32_t(payload.size())},
                              std::span(data_.data() + index * kBlockSize, kBlockSize).first<wire::kBlockHeaderSize>());
    std::memcpy(data_.data() + index * kBlockSize + wire::kBlockHeaderSize, payload.data(), payload.size());
    status_[index] = 1;
  }
  uint8_t status(uint32_t i) const { return status_[i]; }

 private:
  std::vector<std::byte> data_;
  std::vector<uint8_t> status_;
};

class RecordingSink : public MessageSink {
 public:
  Status begin(uint16_t d) override {
    if (busy.contains(d)) return {Code::kBusy, "worker backlog"};
    if (fail_next) return fail();
    current[d].clear();
    return Status::ok();
  }
  Status append(uint16_t d, std::span<const std::byte> data) override {
    if (fail_next) return fail();
    current[d].append(reinterpret_cast<const char*>(data.data()), data.size());
    return Status::ok();
  }
  Status commit(uint16_t d) override {
    if (fail_next) return fail();
    messages[d].push_back(current[d]);
    return Status::ok();
  }
  void abort(uint16_t d) override {
    current[d].clear();
    ++aborts;
  }
  Status fail() {
    --fail_next;
    return {Code::kIoError, "disk full"};
  }
  int fail_next = 0;
  int aborts = 0;
  std::set<uint16_t> busy;  // devices whose worker is behind
  std::map<uint16_t, std::string> current;
  std::map<uint16_t, std::vector<std::string>> messages;
};

constexpr uint8_t kOnly = wire::kFirstFragment | wire::kLastFragment;

struct Fixture {
  FakeBlocks blocks{8};
  RecordingSink sink;
  Delivery delivery{blocks, sink, {0, 1}};
  size_t pass() {
    size_t n = 0;
    EXPECT_TRUE(delivery.pass(&n).is_ok());
    return n;
  }
};

TEST(Delivery, BufferUtilisationIsTimeWeightedHeldMemoryAndPayload) {
  Fixture f;
  f.pass();  // empty: the clock starts
  f.blocks.put(0, 0, 0, kOnly, std::string(16, 'a'));
  f.blocks.put(1, 0, 1, kOnly, std::string(8, 'b'));
  f.sink.fail_next = 1;  // the records stay held through this pass...
  size_t n = 0;
  EXPECT_FALSE(f.delivery.pass(&n).is_ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  f.pass();  // ...for 20 ms, then they are delivered
  const auto& c = f.delivery.counters();
  ASSERT_GT(c.buffer_observed_ns, 20e6);
  // Held: two whole blocks; useful: their 24 payload bytes — for most of the observed time.
  EXPECT_NEAR(c.buffer_held_byte_ns / c.buffer_useful_byte_ns, 2.0 * kBlockSize / 24, 1e-9);
  EXPECT_GT(c.buffer_held_byte_ns / c.buffer_observed_ns, 0.9 * 2 * kBlockSize);
  f.pass();
  f.pass();  // nothing held any more: the averages fall
  EXPECT_LT(f.delivery.counters().buffer_held_byte_ns / f.delivery.counters().buffer_observed_ns, 2.0 * kBlockSize);
}

TEST(Delivery, ReordersByPacketNumberWhateverTheBlockPosition) {
  Fixture f;
  f.blocks.put(0, 0, 1, kOnly, "second");
  f.blocks.put(5, 0, 0, kOnly, "first");
  f.blocks.put(3, 1, 0, kOnly, "other device");
  EXPECT_EQ(f.pass(), 3u);
  EXPECT_EQ(f.sink.messages[0], (std::vector<std::string>{"first", "second"}));
  EXPECT_EQ(f.sink.messages[1], (std::vector<std::string>{"other device"}));
  for (uint32_t i = 0; i < 8; ++i) EXPECT_EQ(f.blocks.status(i), 0) << "block " << i << " not released";
}

TEST(Delivery, ReassemblesFragmentsAndNeverExposesHalfAMessage) {
  Fixture f;
  f.blocks.put(2, 0, 0, wire::kFirstFragment, "aaa");
  f.blocks.put(4, 0, 1, 0, "bbb");
  f.pass();
  EXPECT_TRUE(f.sink.messages[0].empty());  // not complete yet
  EXPECT_TRUE(f.delivery.has_open_message());
  f.blocks.put(1, 0, 2, wire::kLastFragment, "c");
  f.pass();
  EXPECT_EQ(f.sink.messages[0], (std::vector<std::string>{"aaabbbc"}));
  EXPECT_EQ(f.delivery.counters().bytes, 7u);
}

TEST(Delivery, WaitsOnePassForALaterPacketThenCountsAGap) {
  Fixture f;
  f.blocks.put(0, 0, 1, kOnly, "late");
  EXPECT_EQ(f.pass(), 0u);  // packet 0 may still be landing: the block stays put
  EXPECT_EQ(f.blocks.status(0), 1);
  EXPECT_EQ(f.delivery.counters().gaps, 0u);
  f.pass();  // second pass without packet 0: it is a gap
  EXPECT_EQ(f.delivery.counters().gaps, 1u);
  f.pass();
  EXPECT_EQ(f.sink.messages[0], (std::vector<std::string>{"late"}));
}

TEST(Delivery, AGapInsideAMessageDiscardsThatMessage) {
  Fixture f;
  f.blocks.put(0, 0, 0, wire::kFirstFragment, "head");
  f.pass();
  f.blocks.put(1, 0, 2, wire::kLastFragment, "tail");  // packet 1 never comes
  f.pass();
  f.pass();
  f.pass();
  EXPECT_TRUE(f.sink.messages[0].empty());
  EXPECT_EQ(f.delivery.counters().gaps, 1u);
  EXPECT_GE(f.delivery.counters().broken_messages, 1u);
  EXPECT_GE(f.sink.aborts, 1);
}

TEST(Delivery, CountsDuplicatesUnknownDevicesOutOfWindowAndBadHeaders) {
  Fixture f;
  f.blocks.put(0, 0, 0, kOnly, "x");
  f.pass();
  f.blocks.put(1, 0, 0, kOnly, "x again");     // duplicate
  f.blocks.put(2, 9, 0, kOnly, "who?");        // device 9 was never declared
  f.blocks.put(3, 1, 1u << 30, kOnly, "far");  // packet far outside the window
  f.blocks.put(4, 1, 0, kOnly, "ok");
  f.blocks.put(5, 1, 1, kOnly, "garbage");
  f.blocks.block(5)[0] = std::byte{0x7f};  // corrupt header
  EXPECT_EQ(f.pass(), 5u);
  const auto& c = f.delivery.counters();
  EXPECT_EQ(c.duplicates, 1u);
  EXPECT_EQ(c.unknown_device, 1u);
  EXPECT_EQ(c.out_of_window, 1u);
  EXPECT_EQ(c.bad_headers, 1u);
  EXPECT_EQ(f.sink.messages[0], (std::vector<std::string>{"x"}));
  EXPECT_EQ(f.sink.messages[1], (std::vector<std::string>{"ok"}));
  EXPECT_EQ(f.sink.messages.count(9), 0u);
}

TEST(Delivery, SinkFailureKeepsTheBlockAndRetriesWithoutDuplicating) {
  Fixture f;
  f.blocks.put(0, 0, 0, wire::kFirstFragment, "abc");
  f.blocks.put(1, 0, 1, wire::kLastFragment, "def");
  f.sink.fail_next = 2;  // begin fails, then append fails
  size_t n = 0;
  EXPECT_EQ(f.delivery.pass(&n).code(), Code::kIoError);
  EXPECT_EQ(f.blocks.status(0), 1);  // still full: back-pressure, nothing lost
  EXPECT_EQ(f.delivery.pass(&n).code(), Code::kIoError);
  EXPECT_EQ(f.blocks.status(0), 1);
  EXPECT_TRUE(f.delivery.pass(&n).is_ok());
  f.pass();
  EXPECT_EQ(f.sink.messages[0], (std::vector<std::string>{"abcdef"}));
}

TEST(Delivery, AbortPartialsDiscardsOpenMessages) {
  Fixture f;
  f.blocks.put(0, 0, 0, wire::kFirstFragment, "half");
  f.pass();
  EXPECT_EQ(f.delivery.abort_partials(), 1u);
  EXPECT_EQ(f.sink.aborts, 1);
  EXPECT_FALSE(f.delivery.has_open_message());
  EXPECT_EQ(f.delivery.counters().partial_discarded, 1u);
}

TEST(Delivery, ABlockedBlockStaysUnprocessedWithoutCountingAGap) {
  Fixture f;
  f.blocks.put(3, 0, 0, kOnly, "held back");
  f.blocks.put(4, 0, 1, kOnly, "next");
  f.delivery.set_blocked(3, true);
  for (int i = 0; i < 4; ++i) f.pass();
  EXPECT_EQ(f.blocks.status(3), 1);
  EXPECT_TRUE(f.sink.messages[0].empty());
  EXPECT_EQ(f.delivery.counters().gaps, 0u);
  f.delivery.set_blocked(3, false);
  f.pass();
  EXPECT_EQ(f.sink.messages[0], (std::vector<std::string>{"held back", "next"}));
}

TEST(Delivery, ABusyDevicePausesAloneAndResumesWhereItStopped) {
  Fixture f;
  std::vector<std::pair<uint16_t, bool>> events;
  f.delivery.set_pause_handler([&](uint16_t d, bool paused) { events.push_back({d, paused}); });
  f.sink.busy = {0};
  f.blocks.put(0, 0, 0, kOnly, "d0 first");
  f.blocks.put(1, 0, 1, kOnly, "d0 second");
  f.blocks.put(2, 1, 0, kOnly, "d1 first");
  f.blocks.put(3, 1, 1, kOnly, "d1 second");
  // Device 1 flows; device 0 is paused with its blocks in place — not a stall of the pass.
  EXPECT_EQ(f.pass(), 2u);
  EXPECT_EQ(f.sink.messages[1], (std::vector<std::string>{"d1 first", "d1 second"}));
  EXPECT_TRUE(f.sink.messages[0].empty());
  EXPECT_EQ(f.blocks.status(0), 1);
  EXPECT_EQ(f.blocks.status(1), 1);
  EXPECT_TRUE(f.delivery.any_paused());
  EXPECT_EQ(events, (std::vector<std::pair<uint16_t, bool>>{{0, true}}));
  // Many passes while paused: its waiting packet is never taken for a gap.
  for (int i = 0; i < 5; ++i) f.pass();
  EXPECT_EQ(f.delivery.counters().gaps, 0u);
  EXPECT_EQ(f.delivery.per_device()[0].pauses, 1u);
  EXPECT_TRUE(f.delivery.per_device()[0].paused);
  // The worker catches up: after the retry interval device 0 goes on, in order.
  f.sink.busy.clear();
  std::this_thread::sleep_for(Delivery::kBusyRetry + std::chrono::milliseconds(10));
  f.pass();
  EXPECT_EQ(f.sink.messages[0], (std::vector<std::string>{"d0 first", "d0 second"}));
  EXPECT_FALSE(f.delivery.any_paused());
  EXPECT_EQ(events.back(), (std::pair<uint16_t, bool>{0, false}));
}

// ------------------------------------------------------------------ packed units (issue 21)

constexpr uint32_t kUnitBlock = 512;

struct Rec {
  uint16_t device;
  uint32_t packet;
  std::string payload;
  uint8_t flags = kOnly;
};

// Blocks that hold packed units (wire/block_header.h), built as the sender builds them.
class UnitBlocks : public protocol::ReceiverProtocol {
 public:
  explicit UnitBlocks(uint32_t n) : data_(n * kUnitBlock), status_(n, 0) {}
  std::vector<uint8_t> setup() const override { return {}; }
  void poll(std::vector<protocol::Record>* out) override {
    for (uint32_t i = 0; i < status_.size(); ++i) {
      if (status_[i] == 1) out->push_back({i, i, {data_.data() + i * kUnitBlock, kUnitBlock}});
    }
  }
  void release(uint64_t i) override {
    ASSERT_EQ(status_[i], 1) << "block " << i << " released twice";
    status_[i] = 0;
    ++releases;
  }
  uint64_t max_records() const override { return status_.size(); }
  // Returns the unit's bytes so that a test can damage them. One record is a plain record.
  std::span<std::byte> put(uint32_t index, const std::vector<Rec>& records) {
    std::byte* b = data_.data() + index * kUnitBlock;
    status_[index] = 1;
    if (records.size() == 1) {
      const Rec& r = records[0];
      wire::encode_block_header({r.flags, r.device, r.packet, uint32_t(r.payload.size())},
                                std::span<std::byte, wire::kBlockHeaderSize>(b, wire::kBlockHeaderSize));
      std::memcpy(b + wire::kBlockHeaderSize, r.payload.data(), r.payload.size());
      return {b, wire::kBlockHeaderSize + r.payload.size()};
    }
    size_t at = wire::kPackedHeaderSize;
    for (const Rec& r : records) {
      wire::encode_block_header({r.flags, r.device, r.packet, uint32_t(r.payload.size())},
                                std::span<std::byte, wire::kBlockHeaderSize>(b + at, wire::kBlockHeaderSize));
      std::memcpy(b + at + wire::kBlockHeaderSize, r.payload.data(), r.payload.size());
      at += wire::packed_record_size(r.payload.size());
    }
    wire::encode_packed_header({uint32_t(records.size()), uint32_t(at)},
                               std::span<std::byte, wire::kPackedHeaderSize>(b, wire::kPackedHeaderSize));
    return {b, at};
  }
  uint8_t status(uint32_t i) const { return status_[i]; }
  int releases = 0;

 private:
  std::vector<std::byte> data_;
  std::vector<uint8_t> status_;
};

// Takes whole messages in batches and can refuse one half-way through a batch.
class BatchSink : public RecordingSink {
 public:
  Status deliver(std::span<const Message> batch, size_t* stored) override {
    ++batches;
    for (*stored = 0; *stored < batch.size(); ++*stored) {
      const Message& m = batch[*stored];
      if (busy.contains(m.device)) return {Code::kBusy, "worker backlog"};
      if (refuse_after >= 0 && refuse_after-- == 0) return {Code::kIoError, "disk full"};
      messages[m.device].emplace_back(reinterpret_cast<const char*>(m.data.data()), m.data.size());
    }
    return Status::ok();
  }
  int batches = 0;
  int refuse_after = -1;  // store this many more messages, then refuse one
};

struct UnitFixture {
  UnitBlocks blocks{8};
  BatchSink sink;
  Delivery delivery{blocks, sink, {0, 1, 2}, kUnitBlock};
  size_t pass() {
    size_t n = 0;
    EXPECT_TRUE(delivery.pass(&n).is_ok());
    return n;
  }
  std::vector<std::string>& got(uint16_t d) { return sink.messages[d]; }
};

TEST(Delivery, APackedUnitIsOneBatchAndOneRelease) {
  UnitFixture f;
  f.blocks.put(4, {{0, 0, "a0"}, {1, 0, "b0"}, {0, 1, "a1"}, {2, 0, ""}, {1, 1, "b1"}});
  EXPECT_EQ(f.pass(), 5u);
  EXPECT_EQ(f.sink.batches, 1);
  EXPECT_EQ(f.got(0), (std::vector<std::string>{"a0", "a1"}));
  EXPECT_EQ(f.got(1), (std::vector<std::string>{"b0", "b1"}));
  EXPECT_EQ(f.got(2), (std::vector<std::string>{""}));
  EXPECT_EQ(f.blocks.releases, 1);
  EXPECT_EQ(f.delivery.counters().units, 1u);
  EXPECT_EQ(f.delivery.counters().messages, 5u);
}

TEST(Delivery, ARecordAheadOfItsPredecessorWaitsWhileTheRestOfItsUnitGoes) {
  UnitFixture f;
  f.blocks.put(2, {{0, 1, "a1"}, {1, 0, "b0"}});  // a0 is in a block the scan has not seen yet
  f.pass();
  EXPECT_EQ(f.got(1), (std::vector<std::string>{"b0"}));
  EXPECT_TRUE(f.got(0).empty());
  EXPECT_EQ(f.blocks.status(2), 1) << "a1 still waits in it";
  f.blocks.put(6, {{0, 0, "a0"}, {1, 1, "b1"}});
  f.pass();
  EXPECT_EQ(f.got(0), (std::vector<std::string>{"a0", "a1"}));
  EXPECT_EQ(f.got(1), (std::vector<std::string>{"b0", "b1"})) << "b0 was not offered twice";
  EXPECT_EQ(f.delivery.counters().duplicates, 0u);
  EXPECT_EQ(f.delivery.counters().gaps, 0u);
  EXPECT_EQ(f.blocks.status(2), 0);
  EXPECT_EQ(f.blocks.status(6), 0);
}

TEST(Delivery, ABatchRefusedHalfWayIsOfferedAgainFromWhereItStopped) {
  UnitFixture f;
  f.blocks.put(0, {{0, 0, "a0"}, {1, 0, "b0"}, {0, 1, "a1"}, {1, 1, "b1"}});
  f.sink.refuse_after = 2;  // a0 and b0 stored, then the disk is full
  size_t n = 0;
  EXPECT_EQ(f.delivery.pass(&n).code(), Code::kIoError);
  EXPECT_EQ(f.blocks.status(0), 1) << "back-pressure: the unit stays";
  EXPECT_EQ(f.got(0), (std::vector<std::string>{"a0"}));
  f.pass();
  EXPECT_EQ(f.got(0), (std::vector<std::string>{"a0", "a1"}));
  EXPECT_EQ(f.got(1), (std::vector<std::string>{"b0", "b1"}));
  EXPECT_EQ(f.delivery.counters().duplicates, 0u);
  EXPECT_EQ(f.blocks.status(0), 0);
}

TEST(Delivery, ABusyDevicesRecordsAreCopiedOutOfASharedUnitSoTheOthersFlow) {
  UnitFixture f;
  std::vector<std::pair<uint16_t, bool>> events;
  f.delivery.set_pause_handler([&](uint16_t d, bool paused) { events.push_back({d, paused}); });
  f.sink.busy = {0};
  f.blocks.put(1, {{0, 0, "a0"}, {1, 0, "b0"}, {0, 1, "a1"}});
  f.blocks.put(3, {{1, 1, "b1"}, {0, 2, "a2"}});
  f.pass();
  EXPECT_EQ(f.got(1), (std::vector<std::string>{"b0", "b1"}));
  EXPECT_EQ(f.blocks.status(1), 0) << "released: device 0's records were copied aside";
  EXPECT_EQ(f.blocks.status(3), 0);
  EXPECT_EQ(f.delivery.counters().parked, 3u);
  EXPECT_EQ(events, (std::vector<std::pair<uint16_t, bool>>{{0, true}}));
  for (int i = 0; i < 3; ++i) f.pass();
  EXPECT_EQ(f.delivery.counters().gaps, 0u);
  // Its later records keep coming: they wait too (copied aside, in order).
  f.blocks.put(5, {{0, 3, "a3"}, {1, 2, "b2"}});
  f.pass();
  f.sink.busy.clear();
  std::this_thread::sleep_for(Delivery::kBusyRetry + std::chrono::milliseconds(10));
  f.pass();
  EXPECT_EQ(f.got(0), (std::vector<std::string>{"a0", "a1", "a2", "a3"}));
  EXPECT_EQ(f.got(1), (std::vector<std::string>{"b0", "b1", "b2"}));
  EXPECT_EQ(events.back(), (std::pair<uint16_t, bool>{0, false}));
  EXPECT_EQ(f.delivery.counters().duplicates, 0u);
}

TEST(Delivery, VoidRecordsAreSkippedAndABadRestCountsOnceHoweverLongItsUnitWaits) {
  UnitFixture f;
  f.blocks.put(0, {{0, 0, "a0"}, {1, 0, "--void--", wire::kVoid}, {0, 1, "a1"}});
  f.pass();
  EXPECT_EQ(f.got(0), (std::vector<std::string>{"a0", "a1"}));
  EXPECT_TRUE(f.got(1).empty());
  EXPECT_EQ(f.delivery.counters().bad_headers, 0u);
  // b1 waits for b0 (in a block held back meanwhile: no gap can be concluded), and the record
  // after b1 is torn: the unit stays over several passes.
  auto u = f.blocks.put(2, {{1, 1, "b1"}, {2, 0, "c0"}});
  u[wire::kPackedHeaderSize + 24 + 6] ^= std::byte{1};
  f.blocks.put(4, {{1, 0, "b0"}, {2, 1, "c1"}});
  f.delivery.set_blocked(4, true);
  for (int i = 0; i < 4; ++i) f.pass();
  EXPECT_EQ(f.blocks.status(2), 1);
  EXPECT_EQ(f.delivery.counters().bad_headers, 1u);
  f.delivery.set_blocked(4, false);
  f.pass();
  EXPECT_EQ(f.got(1), (std::vector<std::string>{"b0", "b1"}));
  EXPECT_EQ(f.delivery.counters().bad_headers, 1u);
  EXPECT_EQ(f.blocks.status(2), 0);
}

TEST(Delivery, AMessageSpanningBlocksComesAfterTheWholeOnesBeforeIt) {
  UnitFixture f;
  f.blocks.put(0, {{0, 0, "small"}, {1, 0, "b0"}});
  f.blocks.put(1, {{0, 1, "big-", wire::kFirstFragment}, {1, 1, "b1"}});
  f.blocks.put(2, {{0, 2, "end", wire::kLastFragment}});
  f.pass();
  EXPECT_EQ(f.got(0), (std::vector<std::string>{"small", "big-end"}));
  EXPECT_EQ(f.got(1), (std::vector<std::string>{"b0", "b1"}));
}

TEST(Delivery, TheReorderWindowGrowsWithTheRecordsABlockCanHold) {
  EXPECT_EQ(Delivery::window(32), 256u);  // one record per block: as before packing
  EXPECT_EQ(Delivery::window(32, 65536 / 16), 4u * 32 * 4096);
  EXPECT_EQ(Delivery::window(4096, (64u << 20) / 16), uint64_t(1) << 30);  // capped
  UnitFixture f;
  // 8 blocks of 512 bytes, 32 records each: a packet 300 ahead is believable (and waits), one
  // 2000 ahead is not.
  f.blocks.put(0, {{0, 300, "far"}, {1, 2000, "too far"}});
  f.pass();
  EXPECT_EQ(f.delivery.counters().out_of_window, 1u);
  EXPECT_EQ(f.blocks.status(0), 1) << "the believable one waits in its unit";
}

TEST(Delivery, StoreLatencyRunsFromTakingUpTheFirstBlockToTheCommitAndIncludesWaits) {
  Fixture f;
  f.blocks.put(0, 0, 0, wire::kFirstFragment, "aaa");
  f.pass();  // the message is taken up here...
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  f.blocks.put(1, 0, 1, wire::kLastFragment, "b");
  f.pass();  // ...and stored here, 30 ms later
  f.sink.busy = {1};
  f.blocks.put(2, 1, 0, kOnly, "waits for its worker");
  f.pass();
  f.sink.busy.clear();
  std::this_thread::sleep_for(Delivery::kBusyRetry + std::chrono::milliseconds(10));
  f.pass();
  const LatencyHistogram& h = f.delivery.counters().store_latency;
  ASSERT_EQ(h.count, 2u);
  EXPECT_GE(h.sum_seconds, 0.030 + 0.100);  // the fragments' 30 ms and the paused device's retry
  EXPECT_LT(h.sum_seconds, 5.0);
  uint64_t in_buckets = 0;
  for (uint64_t n : h.buckets) in_buckets += n;
  EXPECT_EQ(in_buckets, 2u);
  EXPECT_EQ(h.buckets.back(), 0u);  // nothing above 5 s
}

// Whole messages stored in one batch are each observed once; a device paused by its busy sink
// counts its wait, the others' messages of the same unit do not.
TEST(Delivery, StoreLatencyOfABatchCountsEveryMessageAndAPausedDevicesWait) {
  UnitFixture f;
  f.sink.busy = {0};
  f.blocks.put(1, {{0, 0, "a0"}, {1, 0, "b0"}, {1, 1, "b1"}});
  f.pass();
  const LatencyHistogram& h = f.delivery.counters().store_latency;
  EXPECT_EQ(h.count, 2u) << "b0 and b1";
  EXPECT_LT(h.sum_seconds, 0.090) << "they did not wait for device 0";
  EXPECT_EQ(*std::max_element(h.buckets.begin(), h.buckets.end()), 2u) << "one batch, one store latency: one bucket";
  f.sink.busy.clear();
  std::this_thread::sleep_for(Delivery::kBusyRetry + std::chrono::milliseconds(10));
  f.pass();
  ASSERT_EQ(f.got(0), (std::vector<std::string>{"a0"}));
  EXPECT_EQ(h.count, 3u);
  EXPECT_GE(h.sum_seconds, 0.100) << "a0 waited for its sink from the pass that took it up";
}

}  // namespace
}  // namespace slotstream::stream
