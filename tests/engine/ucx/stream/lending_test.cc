// Zero-copy receive's bookkeeping (engine/ucx/stream/lending.h) driven by the delivery over a fake block
// array with status bytes: pure logic, no UCX (the two-process test is
// tests/integration/test_zero_copy.py).
#include "engine/ucx/stream/lending.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "engine/ucx/stream/delivery.h"
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
  // In block order, or (shuffle set) in an order of its choosing: the real protocol scans from
  // the block after the last one it found, so the sender's order and the poll's often differ.
  void poll(std::vector<protocol::Record>* out) override {
    std::vector<uint32_t> order(status_.size());
    for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
    if (shuffle) std::shuffle(order.begin(), order.end(), *shuffle);
    for (uint32_t i : order) {
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
  uint32_t blocks() const { return uint32_t(status_.size()); }
  // Which block a view's bytes lie in (-1: not in any: a copy).
  int32_t block_of(const MessageView& v) const {
    const std::byte* p = v.data().data();
    if (v.copied() || p < data_.data() || p >= data_.data() + data_.size()) return -1;
    return int32_t((p - data_.data()) / kBlock);
  }
  std::atomic<int> wrong{0};  // transitions from a status they must not start from
  std::mt19937* shuffle = nullptr;

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
    if (busy || (busy_now && busy_now())) return {Code::kBusy, "application queue full"};
    views.push_back(std::move(view));
    return Status::ok();
  }
  std::string text(size_t k) const {
    auto d = views.at(k).data();
    return {reinterpret_cast<const char*>(d.data()), d.size()};
  }
  bool busy = false;
  std::function<bool()> busy_now;  // asked at every view when set (a queue that fills now and then)
  std::deque<MessageView> views;
};

struct Fixture {
  explicit Fixture(uint32_t max_held = 0, uint32_t blocks = 8, std::vector<uint16_t> devices = {0, 1}) {
    proto = std::make_shared<HeldBlocks>(blocks);
    lending = std::make_shared<Lending>("cam", nullptr, proto, blocks, max_held);
    auto v = std::make_unique<KeepViews>();
    views = v.get();
    sink = std::make_unique<LendingSink>(lending, std::move(v));
    delivery = std::make_unique<Delivery>(*proto, *sink, devices, kBlock);
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

// ------------------------------------------------ packed blocks shared by devices (issue 35)

std::string payload_of(uint16_t device, uint32_t packet) {
  return "d" + std::to_string(device) + "p" + std::to_string(packet);
}

std::string text_of(const MessageView& v) { return {reinterpret_cast<const char*>(v.data().data()), v.data().size()}; }

// Units whose views were all released must not count against the limit while some of their records
// wait: here block 2 holds device 1's packets 0 and 1 around device 0's packet 1, whose predecessor
// lies in block 5 (polled after block 2). With one block allowed, block 2 is lent (device 1's two
// messages) and device 0's wait — the delivery kept block 2's lease for the record still in it, so
// that block 5 could never be lent: the stream stopped for good although the application held nothing.
TEST(Lending, AUnitWhoseViewsWereReleasedNoLongerCountsWhileItsOtherRecordsWait) {
  Fixture f(/*max_held=*/1);
  f.proto->put(2, {{1, 0, payload_of(1, 0)}, {0, 1, payload_of(0, 1)}, {1, 1, payload_of(1, 1)}});
  f.proto->put(5, {{0, 0, payload_of(0, 0)}});
  std::vector<std::string> got;
  for (int k = 0; k < 8 && got.size() < 4; ++k) {
    f.pass();
    EXPECT_LE(f.lending->held(), 1u);
    for (auto& v : f.views->views) got.push_back(text_of(v));
    f.views->views.clear();  // every view released before the next pass
    EXPECT_EQ(f.lending->held(), 0u) << "no view is alive: no block is held for the application";
  }
  std::vector<std::string> d0, d1;
  for (const auto& t : got) (t[1] == '0' ? d0 : d1).push_back(t);
  EXPECT_EQ(d0, (std::vector<std::string>{"d0p0", "d0p1"}));
  EXPECT_EQ(d1, (std::vector<std::string>{"d1p0", "d1p1"}));
  EXPECT_EQ(f.proto->status(2), 0);
  EXPECT_EQ(f.proto->status(5), 0);
  EXPECT_EQ(f.proto->wrong, 0);
}

// What a sender leaves in the blocks: each device's packets in order, the devices interleaved at
// random, packed 1 to `pack` records a unit (pack 1: pack=off), each unit in a free block of its
// choosing (blocks come free in the order the application releases them).
class FakeSender {
 public:
  FakeSender(uint32_t devices, uint32_t messages, uint32_t pack, uint32_t seed) : rng_(seed), pack_(pack) {
    std::vector<uint32_t> next(devices, 0);
    for (uint32_t i = 0; i < messages; ++i) {
      const auto d = uint16_t(rng_() % devices);
      order_.push_back({d, next[d]++});
    }
  }
  // Writes up to `units` units into free blocks; false once everything is written.
  bool write(HeldBlocks& proto, uint32_t units) {
    for (uint32_t u = 0; u < units && sent_ < order_.size(); ++u) {
      std::vector<uint32_t> free;
      for (uint32_t i = 0; i < proto.blocks(); ++i) {
        if (proto.status(i) == 0) free.push_back(i);
      }
      if (free.empty()) break;
      const uint32_t n = std::min<uint32_t>(1 + rng_() % pack_, uint32_t(order_.size() - sent_));
      std::vector<Rec> recs;
      for (uint32_t k = 0; k < n; ++k, ++sent_) {
        recs.push_back(
            {order_[sent_].first, order_[sent_].second, payload_of(order_[sent_].first, order_[sent_].second)});
      }
      proto.put(free[rng_() % free.size()], recs);
    }
    return sent_ < order_.size();
  }
  size_t total() const { return order_.size(); }

 private:
  std::mt19937 rng_;
  uint32_t pack_;
  std::vector<std::pair<uint16_t, uint32_t>> order_;
  size_t sent_ = 0;
};

// What the application got: each device's messages in order and whole.
struct Received {
  std::map<uint16_t, uint32_t> next;
  size_t count = 0;
  std::string error;
  void check(const MessageView& v) {
    const uint32_t want = next[v.device()]++;
    ++count;
    if (error.empty() && (v.packet() != want || text_of(v) != payload_of(v.device(), want))) {
      error = "device " + std::to_string(v.device()) + ": got packet " + std::to_string(v.packet()) + " '" +
              text_of(v) + "', expected packet " + std::to_string(want);
    }
  }
};

// Several devices sharing packed blocks, blocks polled in random orders, an application keeping a
// random number of views (fewer than the limit) and releasing them in random orders, a queue that is
// full now and then (a device paused, its records copied aside): every message arrives in order and
// the held count is, after every pass, exactly the blocks the application's views lie in.
TEST(Lending, RandomHoldAndReleaseOrdersOverSharedPackedBlocksNeverStall) {
  for (uint32_t seed = 1; seed <= 120; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    const uint32_t blocks = 4 + rng() % 13;
    const uint32_t max_held = 1 + rng() % blocks;
    const uint32_t keep = rng() % max_held;  // views the application keeps: fewer blocks than the limit
    const uint32_t devices = 1 + rng() % 4;
    const uint32_t pack = seed % 4 == 0 ? 1 : 2 + rng() % 4;  // every fourth: pack=off
    std::vector<uint16_t> ids;
    for (uint16_t d = 0; d < devices; ++d) ids.push_back(d);
    Fixture f(max_held, blocks, ids);
    f.proto->shuffle = &rng;
    f.views->busy_now = [&] { return rng() % 50 == 0; };
    FakeSender sender(devices, 300, pack, seed);
    Received got;
    std::vector<MessageView> held;
    auto now = std::chrono::steady_clock::now();
    for (int step = 0; step < 20000 && got.count < sender.total(); ++step) {
      sender.write(*f.proto, 1 + rng() % 3);
      size_t n = 0;
      ASSERT_TRUE(f.delivery->pass(&n, now).is_ok());
      now += std::chrono::milliseconds(10);  // a paused device is tried again after 10 passes
      for (auto& v : f.views->views) {
        got.check(v);
        held.push_back(std::move(v));
      }
      f.views->views.clear();
      while (held.size() > keep) {
        const size_t k = rng() % held.size();
        held[k].release();
        held.erase(held.begin() + std::ptrdiff_t(k));
      }
      std::set<int32_t> in;
      for (const auto& v : held) {
        if (int32_t b = f.proto->block_of(v); b >= 0) in.insert(b);
      }
      ASSERT_EQ(f.lending->held(), in.size())
          << "held blocks counted beyond those the application's " << held.size() << " views lie in (step " << step
          << ", max_held " << max_held << ", " << devices << " devices, pack " << pack << ")";
    }
    EXPECT_EQ(got.count, sender.total()) << "stalled: " << blocks << " blocks, max_held " << max_held << ", keep "
                                         << keep << ", " << devices << " devices, pack " << pack;
    EXPECT_EQ(got.error, "");
    EXPECT_EQ(f.delivery->counters().gaps, 0u);
    EXPECT_EQ(f.delivery->counters().duplicates, 0u);
    held.clear();
    EXPECT_EQ(f.lending->held(), 0u);
    for (uint32_t i = 0; i < blocks; ++i) EXPECT_EQ(f.proto->status(i), 0) << "block " << i;
    EXPECT_EQ(f.proto->wrong, 0);
    if (HasFailure()) break;
  }
}

// The same with threads: the sender writes blocks on its own thread, and views are released by
// other threads after a random while, in any order; the consumer waits for releases at the limit as
// the session does. Bounded: a stall fails the test instead of hanging it.
TEST(Lending, ViewsReleasedByOtherThreadsWhileTheSenderWritesNeverStall) {
  for (uint32_t seed = 1; seed <= 12; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    const uint32_t blocks = 4 + rng() % 13;
    const uint32_t max_held = 1 + rng() % blocks;
    const uint32_t devices = 2 + rng() % 3;
    const uint32_t pack = seed % 3 == 0 ? 1 : 2 + rng() % 4;
    std::vector<uint16_t> ids;
    for (uint16_t d = 0; d < devices; ++d) ids.push_back(d);
    Fixture f(max_held, blocks, ids);
    std::mt19937 poll_rng(seed * 7919);
    f.proto->shuffle = &poll_rng;  // the consumer's thread only
    FakeSender sender(devices, 2000, pack, seed);
    std::atomic<bool> stop{false};
    std::thread writer([&] {
      std::mt19937 pace(seed);
      while (!stop && sender.write(*f.proto, 1)) {
        if (pace() % 4 == 0) std::this_thread::yield();
      }
    });
    // Releasing threads: each takes views from its queue and releases them after a random while.
    struct Releaser {
      std::mutex mu;
      std::condition_variable cv;
      std::deque<MessageView> queue;
      std::thread thread;
    };
    std::vector<std::unique_ptr<Releaser>> releasers;
    std::atomic<uint32_t> in_app{0};  // views handed to releasing threads, not released yet
    for (int t = 0; t < 3; ++t) {
      auto& r = *releasers.emplace_back(std::make_unique<Releaser>());
      r.thread = std::thread([&r, &stop, &in_app, t, seed] {
        std::mt19937 wait(seed * 31 + t);
        for (;;) {
          MessageView v;
          {
            std::unique_lock lock(r.mu);
            r.cv.wait(lock, [&] { return stop || !r.queue.empty(); });
            if (r.queue.empty()) return;
            // Newest or oldest first, at random.
            if (wait() % 2) {
              v = std::move(r.queue.front());
              r.queue.pop_front();
            } else {
              v = std::move(r.queue.back());
              r.queue.pop_back();
            }
          }
          if (wait() % 8 == 0) std::this_thread::sleep_for(std::chrono::microseconds(wait() % 300));
          v.release();
          in_app.fetch_sub(1);
        }
      });
    }
    Received got;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (got.count < sender.total() && std::chrono::steady_clock::now() < deadline) {
      size_t n = 0;
      ASSERT_TRUE(f.delivery->pass(&n).is_ok());
      ASSERT_LE(f.lending->held(), f.lending->max_held());
      for (auto& v : f.views->views) {
        got.check(v);
        auto& r = *releasers[rng() % releasers.size()];
        in_app.fetch_add(1);
        std::lock_guard lock(r.mu);
        r.queue.push_back(std::move(v));
        r.cv.notify_one();
      }
      f.views->views.clear();
      if (f.delivery->lend_limited()) {
        f.lending->wait_release(std::chrono::microseconds(1000));
      } else if (n == 0) {
        std::this_thread::yield();
      }
    }
    stop = true;
    for (auto& r : releasers) {
      {
        std::lock_guard lock(r->mu);
        r->cv.notify_all();
      }
      r->thread.join();
    }
    writer.join();
    EXPECT_EQ(got.count, sender.total()) << "stalled: " << blocks << " blocks, max_held " << max_held << ", " << devices
                                         << " devices, pack " << pack << "; lending holds " << f.lending->held()
                                         << ", views unreleased " << in_app.load();
    EXPECT_EQ(got.error, "");
    EXPECT_EQ(in_app.load(), 0u);
    EXPECT_EQ(f.lending->held(), 0u);
    for (uint32_t i = 0; i < blocks; ++i) EXPECT_EQ(f.proto->status(i), 0) << "block " << i;
    EXPECT_EQ(f.proto->wrong, 0);
    if (HasFailure()) break;
  }
}

TEST(Lending, HeldLimitDefaultsToHalfTheBlocks) {
  EXPECT_EQ(Lending::held_limit(32, 0), 16u);
  EXPECT_EQ(Lending::held_limit(1, 0), 1u);
  EXPECT_EQ(Lending::held_limit(4, 10), 4u);
  EXPECT_EQ(Lending::held_limit(8, 3), 3u);
}

}  // namespace
}  // namespace slotstream::stream
