// buffered_read over real UCX, both halves in one process and driven by hand: what is special about
// it beyond the suite every protocol runs (protocol_test.cc) — a passive sender on shared memory,
// out-of-order frees, the head written back now and then, records across the wrap, and a ring the
// sender could not have written (hand-built, which also pins the wire layout).
#include "engine/ucx/protocol/buffered_read.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../fabric/connect.h"
#include "wire/codec.h"

namespace slotstream::protocol {
namespace {

std::string pattern(size_t i, size_t length) {
  std::string s(length, '\0');
  std::mt19937 rng(uint32_t(i * 7919 + 1));
  for (auto& c : s) c = char(rng());
  return s;
}

std::string bytes_of(const Record& r) { return {reinterpret_cast<const char*>(r.bytes.data()), r.bytes.size()}; }

// A sender half and a receiver half connected over one context: the sender's worker is progressed
// only when pump() is asked to (tcp needs it; shared memory must not).
class Pair {
 public:
  Pair(Transport wire, Geometry g, const std::string& options = "") : wire_(wire), geometry_(g) {
    EXPECT_TRUE(Options::parse(options, &options_).is_ok());
    EXPECT_TRUE(fabric::Context::create(wire, &ctx_).is_ok());
    EXPECT_TRUE(fabric::Worker::create(*ctx_, false, true, &sender_worker_).is_ok());
    EXPECT_TRUE(fabric::Worker::create(*ctx_, true, true, &receiver_worker_).is_ok());
    EXPECT_TRUE(fabric::connect_pair(*sender_worker_, *receiver_worker_, &to_receiver_).is_ok());
    EXPECT_TRUE(fabric::connect_pair(*receiver_worker_, *sender_worker_, &to_sender_).is_ok());
    sender_fabric_.reset(new SenderFabric{*ctx_, *sender_worker_, *to_receiver_, g, [this] { return alive(); }});
    receiver_fabric_.reset(new ReceiverFabric{*ctx_, *receiver_worker_, g});
  }

  // Over tcp the receiver's gets are answered by the sender's worker, which only this thread
  // progresses: finish them before the receiver is destroyed (it would otherwise wait for them and
  // then leak their memory on purpose, as it must when a live sender stops answering).
  ~Pair() {
    for (int i = 0; rx && i < 20000; ++i) {
      sender_worker_->progress();
      receiver_worker_->progress();
    }
  }

  // Both halves built and connected as the Sender and Receiver do it.
  void connect() {
    const Descriptor* d = find("buffered_read");
    ASSERT_NE(d, nullptr);
    ASSERT_TRUE(d->make_receiver(*receiver_fabric_, options_, &rx).is_ok());
    ASSERT_TRUE(d->make_sender(*sender_fabric_, rx->setup(), options_, &tx).is_ok());
    const std::vector<uint8_t> setup = tx->setup();
    Status st = rx->connect({to_sender_.get(), setup});
    ASSERT_TRUE(st.is_ok()) << st.to_string();
  }

  // Polls until `n` records are out (or a few seconds passed); the sender's worker is progressed
  // only if `sender_answers`.
  std::vector<Record> poll_until(size_t n, bool sender_answers) {
    std::vector<Record> out;
    for (int i = 0; i < 200000 && out.size() < n; ++i) {
      if (sender_answers) sender_worker_->progress();
      rx->progress();
      out.clear();
      rx->poll(&out);
    }
    return out;
  }
  // `n` passes of the receiver's loop, releasing nothing.
  void pump(int n) {
    std::vector<Record> out;
    for (int i = 0; i < n; ++i) {
      sender_worker_->progress();
      rx->progress();
      out.clear();
      rx->poll(&out);
    }
  }
  bool tcp() const { return wire_ == Transport::kTcp; }
  uint64_t counter(const std::string& name) const { return rx->stats().counters.at(name); }

  // transmit_st fails with kTimeout instead of waiting longer than `polls` liveness checks.
  void limit_waits(int polls) { alive_budget_ = polls; }

  // Declared in the order they are built: destroyed protocols first, context last.
  std::unique_ptr<fabric::Context> ctx_;
  std::unique_ptr<fabric::Worker> sender_worker_, receiver_worker_;
  std::unique_ptr<fabric::Endpoint> to_receiver_, to_sender_;
  std::unique_ptr<SenderFabric> sender_fabric_;
  std::unique_ptr<ReceiverFabric> receiver_fabric_;
  Options options_;
  std::unique_ptr<SenderProtocol> tx;
  std::unique_ptr<ReceiverProtocol> rx;

 private:
  Status alive() {
    if (alive_budget_ < 0) return Status::ok();
    if (alive_budget_ == 0) return {Code::kTimeout, "test: the sender would wait for space"};
    --alive_budget_;
    // One thread plays both sides: while the sender waits, the receiver runs a pass (it sees the
    // sender's wait flag and writes back what it freed).
    pump(1);
    return Status::ok();
  }

  Transport wire_;
  Geometry geometry_;
  int alive_budget_ = -1;
};

class BufferedRead : public testing::TestWithParam<Transport> {};

std::string wire_name_of(const testing::TestParamInfo<Transport>& info) { return transport_name(info.param); }

TEST_P(BufferedRead, RecordsArriveByteExactAndOnSharedMemoryWithoutTheSendersWorker) {
  Pair p(GetParam(), {4, 1024});
  p.connect();
  std::vector<std::string> sent;
  for (size_t i = 0; i < 12; ++i) {
    sent.push_back(pattern(i, (i * 97) % 300));
    ASSERT_TRUE(p.tx->transmit_st(reinterpret_cast<const std::byte*>(sent[i].data()), sent[i].size(), nullptr).is_ok());
  }
  // On shared memory the sender's worker is never progressed again: the receiver's reads are
  // done by the receiver alone (the sender is passive). Over tcp UCX needs the sender's worker.
  std::vector<Record> got = p.poll_until(sent.size(), /*sender_answers=*/p.tcp());
  ASSERT_EQ(got.size(), sent.size());
  for (size_t i = 0; i < sent.size(); ++i) EXPECT_EQ(bytes_of(got[i]), sent[i]) << "record " << i;
  EXPECT_EQ(p.rx->stats().records, sent.size());
  EXPECT_GE(p.counter("reads"), 1u);
  EXPECT_EQ(p.counter("bytes_read"), [&] {
    uint64_t b = 0;
    for (const auto& s : sent) b += RingLayout::entry_size(s.size());
    return b;
  }()) << "every entry read exactly once";
}

TEST_P(BufferedRead, ReadsBatchEverythingWrittenSinceTheLastRead) {
  Pair p(GetParam(), {64, 256});
  p.connect();
  const std::string m(40, 'x');
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(p.tx->transmit_st(reinterpret_cast<const std::byte*>(m.data()), m.size(), nullptr).is_ok());
  }
  ASSERT_EQ(p.poll_until(50, p.tcp()).size(), 50u);
  EXPECT_EQ(p.counter("reads"), 1u) << "50 records written before the first read come in one get";
}

TEST_P(BufferedRead, OutOfOrderFreesMoveTheHeadOnlyOverTheFreedPrefix) {
  // Room for exactly 4 records of 1000 bytes (entry 1008, ring 4 x 1032).
  Pair p(GetParam(), {4, 1024});
  p.connect();
  const std::string m(1000, 'a');
  auto send = [&] { return p.tx->transmit_st(reinterpret_cast<const std::byte*>(m.data()), m.size(), nullptr); };
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(send().is_ok());
  std::vector<Record> got = p.poll_until(4, p.tcp());
  ASSERT_EQ(got.size(), 4u);
  // Free 3, 1, 2 — but not 0: nothing before record 0 is free, so the ring stays full.
  for (int i : {3, 1, 2}) p.rx->release(got[i].id);
  std::vector<Record> left;
  p.rx->poll(&left);
  ASSERT_EQ(left.size(), 1u) << "only the unreleased record is still handed out";
  EXPECT_EQ(left[0].id, got[0].id);
  p.limit_waits(200);
  Status st = send();
  EXPECT_EQ(st.code(), Code::kTimeout) << "the sender found room although record 0 was never freed: " << st.to_string();
  EXPECT_EQ(p.tx->stats().waits, 1u);
  EXPECT_EQ(p.counter("head_writes"), 0u) << "the sender asked, but the head had not moved: nothing to write";
  // Free 0: the head passes all four — a whole ring free — and goes back at once.
  p.rx->release(got[0].id);
  EXPECT_EQ(p.counter("head_writes"), 1u);
  p.limit_waits(100000);
  st = send();
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_GE(p.counter("head_writes"), 1u);
}

TEST_P(BufferedRead, TheHeadIsWrittenBackNowAndThenNotPerRecord) {
  Pair p(GetParam(), {16, 128});
  p.connect();
  const uint64_t n = 2000;
  uint64_t received = 0;
  std::vector<Record> recs;
  auto drain = [&] {
    p.sender_worker_->progress();
    recs.clear();
    p.rx->progress();
    p.rx->poll(&recs);
    for (const Record& r : recs) {
      p.rx->release(r.id);
      ++received;
    }
  };
  for (uint64_t i = 0; i < n; ++i) {
    const std::string m = pattern(i, 1 + i % 100);
    // The ring holds 16 records of 128 bytes: the receiver must free and write back many times.
    // A sender that would wait gives up after a few polls here, and the receiver runs.
    for (;;) {
      p.limit_waits(20);
      Status st = p.tx->transmit_st(reinterpret_cast<const std::byte*>(m.data()), m.size(), nullptr);
      if (st.is_ok()) break;
      ASSERT_EQ(st.code(), Code::kTimeout) << st.to_string();
      drain();
    }
    drain();
  }
  for (int i = 0; i < 100000 && received < n; ++i) drain();
  ASSERT_EQ(received, n);
  const uint64_t writes = p.counter("head_writes");
  EXPECT_GT(writes, 10u) << "a ring of 16 records cannot carry 2000 without the head coming back";
  EXPECT_LT(writes, n / 4) << "the head went back for (nearly) every record";
}

TEST_P(BufferedRead, ARecordAcrossTheEndOfTheRingIsOneContiguousSpan) {
  Pair p(GetParam(), {3, 1000});  // ring 3 x 1008 = 3024 bytes
  p.connect();
  // 2 x 1000-byte records (1008 each), freed; then one of 1000 at position 2016 fits before the
  // end, and the next one starts at 3024 + ... : choose sizes so an entry straddles the wrap.
  const std::vector<size_t> sizes = {1000, 1000, 500, 1000, 1000, 1000};
  size_t crossings = 0;
  uint64_t pos = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const std::string m = pattern(i, sizes[i]);
    const uint64_t cap = RingLayout::capacity({3, 1000});
    if ((pos + 8) / cap != (pos + 8 + sizes[i] - 1) / cap) ++crossings;
    pos += RingLayout::entry_size(sizes[i]);
    p.limit_waits(100000);
    ASSERT_TRUE(p.tx->transmit_st(reinterpret_cast<const std::byte*>(m.data()), m.size(), nullptr).is_ok());
    std::vector<Record> got = p.poll_until(1, p.tcp());
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(bytes_of(got[0]), m) << "record " << i;
    p.rx->release(got[0].id);
  }
  EXPECT_GE(crossings, 1u) << "the sizes were meant to put a record across the end of the ring";
}

TEST_P(BufferedRead, PipelinedReadsDeliverTheSameBytes) {
  Pair p(GetParam(), {8, 512}, "pipeline=on,max_read=256");
  p.connect();
  std::vector<std::string> sent;
  for (size_t i = 0; i < 6; ++i) {
    sent.push_back(pattern(i, 100 + 50 * i));
    ASSERT_TRUE(p.tx->transmit_st(reinterpret_cast<const std::byte*>(sent[i].data()), sent[i].size(), nullptr).is_ok());
  }
  std::vector<Record> got = p.poll_until(sent.size(), true);
  ASSERT_EQ(got.size(), sent.size());
  for (size_t i = 0; i < sent.size(); ++i) EXPECT_EQ(bytes_of(got[i]), sent[i]);
  EXPECT_GE(p.counter("reads"), 4u) << "max_read=256 splits ~1.3 KB of entries into several gets";
}

TEST_P(BufferedRead, FinishWaitsUntilTheReceiverFreedEverything) {
  Pair p(GetParam(), {4, 256});
  p.connect();
  const std::string m(100, 'f');
  ASSERT_TRUE(p.tx->transmit_st(reinterpret_cast<const std::byte*>(m.data()), m.size(), nullptr).is_ok());
  p.limit_waits(50);
  EXPECT_EQ(p.tx->finish_st().code(), Code::kTimeout) << "finish returned with a record not yet read";
  std::vector<Record> got = p.poll_until(1, p.tcp());
  ASSERT_EQ(got.size(), 1u);
  p.rx->release(got[0].id);
  p.limit_waits(100000);  // finish raises the wait flag: the next pass writes the head back
  EXPECT_TRUE(p.tx->finish_st().is_ok());
}

INSTANTIATE_TEST_SUITE_P(Wires, BufferedRead, testing::Values(Transport::kShm, Transport::kTcp), wire_name_of);

// ------------------------------------------------------------- a ring built by hand (the layout)

// A "sender" that is only a UCX-allocated region written by the test: the receiver cannot tell.
class HandRing : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fabric::Context::create(Transport::kShm, &ctx_).is_ok());
    ASSERT_TRUE(fabric::Worker::create(*ctx_, false, false, &owner_).is_ok());
    ASSERT_TRUE(fabric::Worker::create(*ctx_, true, false, &reader_).is_ok());
    ASSERT_TRUE(fabric::connect_pair(*reader_, *owner_, &ep_).is_ok());
    capacity_ = RingLayout::capacity(geometry_);
    ASSERT_TRUE(fabric::MemoryRegion::allocate(*ctx_, RingLayout::kDataOffset + capacity_, &region_).is_ok());
    ASSERT_TRUE(region_->pack_rkey(&rkey_).is_ok());
    fabric_.reset(new ReceiverFabric{*ctx_, *reader_, geometry_});
    ASSERT_TRUE(kBufferedRead.make_receiver(*fabric_, Options{}, &rx_).is_ok());
  }

  std::vector<uint8_t> setup(uint8_t version, uint64_t capacity) const {
    wire::Writer w;
    w.u8(version);
    w.u64(region_->remote_address());
    w.u64(capacity);
    w.blob32(rkey_);
    return std::move(w.buffer());
  }
  Status connect() {
    auto s = setup(RingLayout::kRingVersion, capacity_);
    return rx_->connect({ep_.get(), s});
  }
  // Writes an entry at `pos` with the given prefix words, then the record.
  void entry(uint64_t pos, uint32_t length, uint32_t check, const std::string& record) {
    std::byte* data = region_->data() + RingLayout::kDataOffset;
    std::memcpy(data + pos % capacity_, &length, 4);
    std::memcpy(data + pos % capacity_ + 4, &check, 4);
    std::memcpy(data + (pos + 8) % capacity_, record.data(), record.size());
  }
  void tail(uint64_t t) { std::memcpy(region_->data() + RingLayout::kTailOffset, &t, 8); }
  void waiting(uint64_t w) { std::memcpy(region_->data() + RingLayout::kWaitOffset, &w, 8); }
  uint64_t head() const {
    uint64_t h;
    std::memcpy(&h, region_->data() + RingLayout::kHeadOffset, 8);
    return h;
  }
  std::vector<Record> poll() {
    std::vector<Record> out;
    rx_->poll(&out);
    return out;
  }
  uint64_t errors() const { return rx_->stats().counters.at("protocol_errors"); }

  Geometry geometry_{4, 64};
  uint64_t capacity_ = 0;
  std::unique_ptr<fabric::Context> ctx_;
  std::unique_ptr<fabric::Worker> owner_, reader_;
  std::unique_ptr<fabric::Endpoint> ep_;
  std::unique_ptr<fabric::MemoryRegion> region_;
  std::vector<uint8_t> rkey_;
  std::unique_ptr<ReceiverFabric> fabric_;
  std::unique_ptr<ReceiverProtocol> rx_;
};

TEST_F(HandRing, EntriesLaidOutAsDocumentedAreRead) {
  ASSERT_TRUE(connect().is_ok());
  entry(0, 5, 0, "hello");
  entry(16, 3, 16, "abc");
  tail(32);
  auto recs = poll();
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(bytes_of(recs[0]), "hello");
  EXPECT_EQ(bytes_of(recs[1]), "abc");
  rx_->release(recs[1].id);
  rx_->release(recs[0].id);
  EXPECT_TRUE(poll().empty());
  EXPECT_EQ(head(), 0u) << "32 of 288 bytes free and the sender does not wait: not written yet";
  waiting(1);  // the flag next to the tail (offset 8) asks for the head
  EXPECT_TRUE(poll().empty());
  EXPECT_EQ(head(), 32u) << "the receiver writes its head at offset 64 of the sender's region";
  EXPECT_EQ(errors(), 0u);
}

TEST_F(HandRing, AWrongPositionCheckStopsReadingWithAnError) {
  ASSERT_TRUE(connect().is_ok());
  entry(0, 5, 0, "hello");
  entry(16, 3, 99, "abc");  // check should be 16
  tail(32);
  auto recs = poll();
  EXPECT_EQ(recs.size(), 1u) << "the good entry before it is still delivered";
  EXPECT_EQ(errors(), 1u);
  tail(48);
  EXPECT_EQ(poll().size(), 1u) << "nothing after a corrupt entry is read";
}

TEST_F(HandRing, ARecordLongerThanABlockIsAnError) {
  ASSERT_TRUE(connect().is_ok());
  entry(0, 65, 0, std::string(65, 'x'));
  tail(RingLayout::entry_size(65));
  EXPECT_TRUE(poll().empty());
  EXPECT_EQ(errors(), 1u);
}

TEST_F(HandRing, ATailPastOneRingAheadOfTheHeadIsAnError) {
  ASSERT_TRUE(connect().is_ok());
  tail(capacity_ + 8);
  EXPECT_TRUE(poll().empty());
  EXPECT_EQ(errors(), 1u);
}

TEST_F(HandRing, ATailCuttingAnEntryIsAnError) {
  ASSERT_TRUE(connect().is_ok());
  entry(0, 20, 0, std::string(20, 'x'));  // entry of 32 bytes
  tail(16);
  EXPECT_TRUE(poll().empty());
  EXPECT_EQ(errors(), 1u);
}

TEST_F(HandRing, SetupOfAnotherVersionOrRingSizeIsRefused) {
  auto v2 = setup(2, capacity_);
  EXPECT_EQ(rx_->connect({ep_.get(), v2}).code(), Code::kVersionMismatch);
  auto bigger = setup(RingLayout::kRingVersion, capacity_ + 8);
  EXPECT_EQ(rx_->connect({ep_.get(), bigger}).code(), Code::kProtocolError);
  auto s = setup(RingLayout::kRingVersion, capacity_);
  s.pop_back();
  EXPECT_EQ(rx_->connect({ep_.get(), s}).code(), Code::kProtocolError) << "truncated";
  EXPECT_EQ(rx_->connect({nullptr, setup(RingLayout::kRingVersion, capacity_)}).code(), Code::kProtocolError)
      << "no endpoint to the sender";
}

}  // namespace
}  // namespace slotstream::protocol
