// The ring receiver (packed_ring, nic_assisted) against hand-made notices over real UCX, shm and
// tcp: a valid segment of several records is delivered record by record and freed with one
// cumulative ACK; notices that break the ring's rules — wrong session, wrong position, across the
// end, beyond the free space, without a credit, malformed — are dropped and counted, and nothing
// they name is handed out.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <thread>

#include "../fabric/connect.h"
#include "engine/ucx/fabric/fabric.h"
#include "engine/ucx/protocol/ring.h"
#include "wire/block_header.h"

namespace slotstream::protocol {
namespace {

std::vector<std::byte> record(uint16_t device, uint32_t packet, size_t payload) {
  std::vector<std::byte> r(wire::kBlockHeaderSize + payload, std::byte{0x5A});
  wire::encode_block_header({wire::kFirstFragment | wire::kLastFragment, device, packet, uint32_t(payload)},
                            std::span(r).first<wire::kBlockHeaderSize>());
  return r;
}

class RingReceiverTest : public testing::TestWithParam<Transport> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fabric::Context::create(GetParam(), &ctx_).is_ok());
    ASSERT_TRUE(fabric::Worker::create(*ctx_, false, true, &rx_worker_).is_ok());
    ASSERT_TRUE(fabric::Worker::create(*ctx_, false, false, &tx_worker_).is_ok());
    ASSERT_TRUE(fabric::connect_pair(*tx_worker_, *rx_worker_, &ep_).is_ok());
  }
  void TearDown() override {
    reqs_.clear();
    rx_.reset();
    rkey_.reset();
    ep_.reset();
  }

  // A receiver with a ring of `blocks` x 256 bytes and virtual window `window`.
  void make(uint32_t blocks, uint64_t window) {
    ReceiverFabric rf{*ctx_, *rx_worker_, {blocks, 256}};
    ASSERT_TRUE(make_ring_receiver(rf, window, &rx_).is_ok());
    ASSERT_TRUE(parse_ring_setup(rx_->setup(), &setup_).is_ok());
    ASSERT_TRUE(fabric::RemoteKey::unpack(*ep_, setup_.rkey, &rkey_).is_ok());
    ASSERT_TRUE(tx_worker_
                    ->set_am_handler(
                        kRingAckAm,
                        [this](std::span<const std::byte> h, std::span<const std::byte>, fabric::ReplyEp) {
                          ASSERT_EQ(h.size(), sizeof(RingAck));
                          std::memcpy(&last_ack_, h.data(), sizeof last_ack_);
                          ++acks_;
                        },
                        &ack_handler_)
                    .is_ok());
  }

  // Requests stay pending until settle(): in one process both workers must progress for them.
  void notice(uint64_t session, uint64_t position, uint32_t length, uint32_t flags) {
    notices_.push_back({session, position, length, flags});
    ASSERT_TRUE(tx_worker_->fence().is_ok());
    reqs_.emplace_back();
    ASSERT_TRUE(
        ep_->am_send(kRingNoticeAm, &notices_.back(), sizeof(RingNotice), nullptr, 0, true, &reqs_.back()).is_ok());
  }
  void put(const std::vector<std::byte>& data, uint64_t position) {
    data_.push_back(data);
    reqs_.emplace_back();
    ASSERT_TRUE(
        ep_->put(data_.back().data(), data.size(), setup_.address + position % setup_.bytes, *rkey_, &reqs_.back())
            .is_ok());
  }
  // Both sides progress for a while (tcp emulates the puts; notices and ACKs are two-sided).
  void settle() {
    for (int i = 0; i < 200; ++i) {
      rx_->progress();
      tx_worker_->progress();
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    for (auto& r : reqs_) EXPECT_TRUE(r.check().is_ok()) << "an operation did not complete";
    reqs_.clear();
  }
  std::vector<Record> records() {
    std::vector<Record> out;
    rx_->poll(&out);
    return out;
  }
  uint64_t counter(const std::string& name) {
    auto c = rx_->stats().counters;
    return c.contains(name) ? c[name] : 0;
  }

  std::unique_ptr<fabric::Context> ctx_;
  std::unique_ptr<fabric::Worker> rx_worker_, tx_worker_;
  std::unique_ptr<fabric::Endpoint> ep_;
  std::unique_ptr<ReceiverProtocol> rx_;
  RingSetup setup_;
  std::unique_ptr<fabric::RemoteKey> rkey_;
  std::deque<RingNotice> notices_;  // headers and sources stay put until the test ends
  std::deque<std::vector<std::byte>> data_;
  std::deque<fabric::Request> reqs_;
  RingAck last_ack_{};
  int acks_ = 0;
  fabric::AmRegistration ack_handler_;  // last: unhooked before tx_worker_ goes
};

TEST_P(RingReceiverTest, SegmentOfSeveralRecordsThenBadNoticesDropped) {
  make(2, 0);  // 512-byte ring
  const auto a = record(1, 0, 10), b = record(2, 7, 0), c = record(1, 1, 100);
  std::vector<std::byte> seg(a);
  seg.insert(seg.end(), b.begin(), b.end());
  seg.insert(seg.end(), c.begin(), c.end());
  put(seg, 0);
  notice(setup_.session, 0, uint32_t(seg.size()), 0);
  settle();
  auto got = records();
  ASSERT_EQ(got.size(), 3u);
  EXPECT_TRUE(std::equal(got[1].bytes.begin(), got[1].bytes.end(), b.begin(), b.end()));
  EXPECT_TRUE(std::equal(got[2].bytes.begin(), got[2].bytes.end(), c.begin(), c.end()));
  EXPECT_EQ(counter("multi_record_segments"), 1u);

  // Not at the tail, across the end, over the free space, another session, unknown flags.
  const uint64_t tail = seg.size();
  notice(setup_.session, 0, 16, 0);
  notice(setup_.session, tail, uint32_t(512 - tail + 1), 0);
  notice(setup_.session ^ 1, tail, 16, 0);
  notice(setup_.session, tail, 16, 0x80);
  notice(setup_.session, tail, uint32_t(512 - tail - 1), kNoticePadding);
  settle();
  EXPECT_EQ(records().size(), 3u) << "a bad notice handed something out";
  EXPECT_EQ(counter("notices_dropped_wrong_position"), 1u);
  EXPECT_EQ(counter("notices_dropped_crosses_end"), 1u);
  EXPECT_EQ(counter("notices_malformed"), 1u);
  EXPECT_EQ(counter("notices_dropped_bad_padding"), 2u);

  // Released in another order: the head moves once all three are; one cumulative ACK.
  for (uint64_t id : {got[2].id, got[0].id, got[1].id}) rx_->release(id);
  settle();
  EXPECT_GE(acks_, 1);
  EXPECT_EQ(last_ack_.freed, tail);

  // The ring is free again: a full lap's worth from the tail would overrun nothing, one byte more
  // would (it also crosses the end).
  notice(setup_.session, tail, uint32_t(512 - tail), kNoticePadding);
  notice(setup_.session, 512, 513, 0);
  settle();
  EXPECT_EQ(counter("wrap_markers"), 1u);
  EXPECT_EQ(counter("notices_dropped_crosses_end"), 2u);
}

TEST_P(RingReceiverTest, NoSegmentBeyondTheCredits) {
  make(2, 256);                      // W = 256: two credits at first
  const auto r = record(3, 0, 200);  // 216 bytes
  for (uint64_t pos : {0, 216}) {
    put(r, pos);
    notice(setup_.session, pos, uint32_t(r.size()), 0);
  }
  settle();
  ASSERT_EQ(records().size(), 2u);
  EXPECT_EQ(acks_, 0) << "80 bytes free: less than a window, no credit";
  const auto small = record(3, 2, 40);
  put(small, 432);
  notice(setup_.session, 432, uint32_t(small.size()), 0);
  settle();
  EXPECT_EQ(records().size(), 2u);
  EXPECT_EQ(counter("notices_dropped_no_credit"), 1u);
  rx_->release(records()[0].id);
  settle();
  EXPECT_EQ(last_ack_.credits, 1u) << "296 bytes free: one credit granted";
}

INSTANTIATE_TEST_SUITE_P(Wires, RingReceiverTest, testing::Values(Transport::kShm, Transport::kTcp),
                         [](const testing::TestParamInfo<Transport>& i) {
                           return std::string(transport_name(i.param));
                         });

}  // namespace
}  // namespace slotstream::protocol
