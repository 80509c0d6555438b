// Zero-copy receive's bookkeeping (stream/lending.h) driven by the delivery over a fake block
// array with status bytes: pure logic, no UCX (the two-process test is
// tests/integration/test_zero_copy.py).
#include "stream/lending.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <deque>
#include <thread>

#include "stream/delivery.h"
#include "wire/block_header.h"

namespace slotstream::stream {
namespace {

constexpr uint32_t kBlock = 256;
constexpr uint8_t kOnly = wire::kFirstFragment | wire::kLastFragment;

struct Rec {
  uint16_t device;
  uint32_t packet;
  std::string payload;
  uint8_t flags = kOnly;
};

// Blocks with the paper's three statuses; release_retained may come from any thread.
class HeldBlocks : public protocol::ReceiverProtocol {
 public:
  explicit HeldBlocks(uint32_t n) : data_(n * kBlock), status_(n) {}
  std::vector<uint8_t> setup() const override { return {}; }
  void poll(std::vector<protocol::Record>* out) override {
    for (uint32_t i = 0; i < status_.size(); ++i) {
      if (status_[i] == 1) out->push_back({i, i, block(i)});
    }
  }
  void release(uint64_t i) override { expect_then(i, 1, 0); }
  void retain(uint64_t i) override { expect_then(i, 1, 2); }
  void release_retained(uint64_t i) override { expect_then(i, 2, 0); }
  uint64_t max_records() const override { return status_.size(); }
  std::span<std::byte> block(uint32_t i) { return {data_.data() + i * kBlock, kBlock}; }
  // What the sender leaves behind: one record, or several behind a packed header.
  void put(uint32_t index, const std::vector<Rec>& records) {
    std::byte* b = data_.data() + index * kBlock;
    size_t at = records.size() == 1 ? 0 : wire::kPackedHeaderSize;
    for (const Rec& r : records) {
      wire::encode_block_header({r.flags, r.device, r.packet, uint32_t(r.payload.size())},
                                std::span<std::byte, wire::kBlockHeaderSize>(b + at, wire::kBlockHeaderSize));
      std::memcpy(b + at + wire::kBlockHeaderSize, r.payload.data(), r.payload.size());
      at += records.size() == 1 ? 0 : wire::packed_record_size(r.payload.size());
    }
    if (records.size() > 1) {
      wire::encode_packed_header({uint32_t(records.size()), uint32_t(at)},
                                 std::span<std::byte, wire::kPackedHeaderSize>(b, wire::kPackedHeaderSize));
    }
    status_[index] = 1;
  }
  uint8_t status(uint32_t i) const { return status_[i].load(); }
  std::atomic<int> wrong{0};  // transitions from a status they must not start from

 private:
  void expect_then(uint64_t i, uint8_t from, uint8_t to) {
    uint8_t expected = from;
    if (!status_[i].compare_exchange_strong(expected, to)) ++wrong;
  }
  std::vector<std::byte> data_;
  std::vector<std::atomic<uint8_t>> status_;
};

class KeepViews : public ViewSink {
 public:
  Status take(MessageView& view) override {
    if (busy) return {Code::kBusy, "application queue full"};
    views.push_back(std::move(view));
    return Status::ok();
  }
  std::string text(size_t k) const {
    auto d = views.at(k).data();
    return {reinterpret_cast<const char*>(d.data()), d.size()};
  }
  bool busy = false;
  std::deque<MessageView> views;
};

struct Fixture {
  explicit Fixture(uint32_t max_held = 0, uint32_t blocks = 8) {
    proto = std::make_shared<HeldBlocks>(blocks);
    lending = std::make_shared<Lending>("cam", nullptr, proto, blocks, max_held);
    auto v = std::make_unique<KeepViews>();
    views = v.get();
    sink = std::make_unique<LendingSink>(lending, std::move(v));
    delivery = std::make_unique<Delivery>(*proto, *sink, std::vector<uint16_t>{0, 1}, kBlock);
    delivery->set_lending(lending, sink.get());
  }
  size_t pass() {
    size_t n = 0;
    EXPECT_TRUE(delivery->pass(&n).is_ok());
    return n;
  }
  bool inside(const MessageView& v, uint32_t block) {
    auto b = proto->block(block);
    return v.data().data() >= b.data() && v.data().data() + v.data().size() <= b.data() + b.size();
  }
  std::shared_ptr<HeldBlocks> proto;
  std::shared_ptr<Lending> lending;
  KeepViews* views = nullptr;
  std::unique_ptr<LendingSink> sink;
  std::unique_ptr<Delivery> delivery;
};

TEST(Lending, AViewLiesInItsBlockWhichIsHeldUntilTheViewIsReleased) {
  Fixture f;
  f.proto->put(0, {{0, 0, "first"}});
  f.proto->put(1, {{0, 1, "second"}});
  EXPECT_EQ(f.pass(), 2u);
  ASSERT_EQ(f.views->views.size(), 2u);
  EXPECT_EQ(f.views->text(0), "first");
  EXPECT_TRUE(f.inside(f.views->views[0], 0)) << "not in place: copied";
  EXPECT_FALSE(f.views->views[0].copied());
  EXPECT_EQ(f.views->views[0].sender(), "cam");
  EXPECT_EQ(f.views->views[1].packet(), 1u);
  EXPECT_EQ(f.proto->status(0), 2) << "a lent block must be held (status 2) for the sender to skip it";
  EXPECT_EQ(f.proto->status(1), 2);
  EXPECT_EQ(f.lending->held(), 2u);
  f.views->views[0].release();
  EXPECT_EQ(f.proto->status(0), 0) << "released: the sender may reuse it";
  EXPECT_EQ(f.proto->status(1), 2);
  EXPECT_TRUE(f.views->views[0].data().empty());
  f.views->views.clear();  // the destructor releases too
  EXPECT_EQ(f.proto->status(1), 0);
  EXPECT_EQ(f.lending->held(), 0u);
  EXPECT_EQ(f.proto->wrong, 0);
  EXPECT_EQ(f.sink->lent(), 2u);
}

TEST(Lending, APackedBlockIsHeldUntilEveryOneOfItsViewsIsReleased) {
  Fixture f;
  f.proto->put(3, {{0, 0, "a0"}, {1, 0, "b0"}, {0, 1, "a1"}});
  EXPECT_EQ(f.pass(), 3u);
  ASSERT_EQ(f.views->views.size(), 3u);
  for (const auto& v : f.views->views) EXPECT_TRUE(f.inside(v, 3));
  EXPECT_EQ(f.lending->held(), 1u) << "one block, one lease";
  f.views->views[2].release();
  f.views->views[0].release();
  EXPECT_EQ(f.proto->status(3), 2);
  f.views->views[1].release();
  EXPECT_EQ(f.proto->status(3), 0);
  EXPECT_EQ(f.proto->wrong, 0);
}

TEST(Lending, AMessageSpanningBlocksIsCopiedOnceAndItsBlocksReleasedAtOnce) {
  Fixture f;
  f.proto->put(0, {{0, 0, "head-", wire::kFirstFragment}});
  f.proto->put(1, {{0, 1, "tail", wire::kLastFragment}});
  f.proto->put(2, {{1, 0, "whole"}});
  f.pass();
  f.pass();
  ASSERT_EQ(f.views->views.size(), 2u);
  const MessageView* frag = &f.views->views[0];
  if (frag->device() != 0) frag = &f.views->views[1];
  EXPECT_TRUE(frag->copied());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(frag->data().data()), frag->data().size()), "head-tail");
  EXPECT_EQ(frag->packet(), 0u) << "a copied message says its first packet";
  EXPECT_EQ(f.proto->status(0), 0);
  EXPECT_EQ(f.proto->status(1), 0);
  EXPECT_EQ(f.proto->status(2), 2);
  EXPECT_EQ(f.proto->wrong, 0);
}

TEST(Lending, TheHeldLimitBackPressuresWithoutLossOrFalseGaps) {
  Fixture f(/*max_held=*/2);
  for (uint32_t p = 0; p < 5; ++p) f.proto->put(p, {{0, p, "m" + std::to_string(p)}});
  for (int k = 0; k < 5; ++k) f.pass();  // many passes at the limit
  ASSERT_EQ(f.views->views.size(), 2u);
  EXPECT_TRUE(f.delivery->lend_limited());
  EXPECT_GT(f.delivery->counters().lend_limited, 0u);
  EXPECT_EQ(f.proto->status(2), 1) << "beyond the limit the message waits in its block";
  EXPECT_EQ(f.delivery->counters().gaps, 0u) << "waiting behind the limit is no gap";
  std::vector<std::string> got;
  while (got.size() < 5) {  // the application releases its oldest view each time
    ASSERT_FALSE(f.views->views.empty());
    got.push_back(f.views->text(0));
    f.views->views.pop_front();
    f.pass();
  }
  EXPECT_EQ(got, (std::vector<std::string>{"m0", "m1", "m2", "m3", "m4"}));
  EXPECT_EQ(f.delivery->counters().gaps, 0u);
  EXPECT_EQ(f.delivery->counters().duplicates, 0u);
  EXPECT_EQ(f.proto->wrong, 0);
}

TEST(Lending, TheHeldCountAtTheRefusalOutlivesLaterReleases) {
  // The held-limit log used to print held() after the pass, when the application had released views
  // meanwhile: "holds 1 blocks, the most it may" with a limit of 2.
  Fixture f(/*max_held=*/2);
  for (uint32_t p = 0; p < 3; ++p) f.proto->put(p, {{0, p, "m" + std::to_string(p)}});
  f.pass();
  ASSERT_TRUE(f.delivery->lend_limited());
  f.views->views.pop_front();  // released on "another thread" before the session logs
  EXPECT_EQ(f.lending->held(), 1u);
  EXPECT_EQ(f.lending->held_at_refusal(), 2u) << "the number that hit the limit";
}

TEST(Lending, ViewsReleasedInAnyOrderFromOtherThreads) {
  Fixture f(/*max_held=*/8);
  for (uint32_t p = 0; p < 6; ++p) f.proto->put((p * 5) % 8, {{uint16_t(p % 2), p / 2, std::to_string(p)}});
  f.pass();
  f.pass();
  ASSERT_EQ(f.views->views.size(), 6u);
  std::vector<std::thread> threads;
  for (size_t k = f.views->views.size(); k-- > 0;) {  // newest first
    threads.emplace_back([v = std::move(f.views->views[k])]() mutable { v.release(); });
  }
  for (auto& t : threads) t.join();
  for (uint32_t i = 0; i < 8; ++i) EXPECT_EQ(f.proto->status(i), 0) << "block " << i;
  EXPECT_EQ(f.lending->held(), 0u);
  EXPECT_EQ(f.proto->wrong, 0);
}

TEST(Lending, ABusyApplicationPausesTheDeviceAndTheMessageIsOfferedAgain) {
  Fixture f;
  f.proto->put(0, {{0, 0, "x"}});
  f.views->busy = true;
  f.pass();
  EXPECT_TRUE(f.views->views.empty());
  EXPECT_EQ(f.proto->status(0), 1);
  f.views->busy = false;
  std::this_thread::sleep_for(Delivery::kBusyRetry + std::chrono::milliseconds(5));
  f.pass();
  ASSERT_EQ(f.views->views.size(), 1u);
  EXPECT_EQ(f.views->text(0), "x");
  EXPECT_EQ(f.proto->status(0), 2);
  EXPECT_EQ(f.proto->wrong, 0);
}

TEST(Lending, AViewOutlivesTheSessionThatLentIt) {
  MessageView kept;
  std::weak_ptr<HeldBlocks> proto;
  {
    Fixture f;
    proto = f.proto;
    f.proto->put(0, {{0, 0, "still here"}});
    f.pass();
    kept = std::move(f.views->views[0]);
  }
  ASSERT_FALSE(proto.expired()) << "the view keeps the block memory";
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(kept.data().data()), kept.data().size()), "still here");
  kept.release();
  EXPECT_TRUE(proto.expired());
}

TEST(Lending, HeldLimitDefaultsToHalfTheBlocks) {
  EXPECT_EQ(Lending::held_limit(32, 0), 16u);
  EXPECT_EQ(Lending::held_limit(1, 0), 1u);
  EXPECT_EQ(Lending::held_limit(4, 10), 4u);
  EXPECT_EQ(Lending::held_limit(8, 3), 3u);
}

}  // namespace
}  // namespace slotstream::stream
