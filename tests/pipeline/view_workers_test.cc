// In-process per-device workers on zero-copy receive (include/slotstream/view_workers.h), over real UCX
// in one process: a Receiver whose views go to ViewWorkers, a Sender beside it (shm and tcp).
#include "slotstream/view_workers.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>

namespace slotstream {
namespace {

using namespace std::chrono_literals;
constexpr uint32_t kBlocks = 8;  // held limit: half, 4
constexpr uint32_t kBlockSize = 4096;
constexpr size_t kMessage = 3000;  // two never share a block: one block, one view, each

std::vector<std::byte> pattern(uint16_t device, uint32_t index, size_t n = kMessage) {
  std::vector<std::byte> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = std::byte((device * 131 + index * 7 + i) & 0xff);
  return b;
}

// Message index carried in its first bytes (pattern() alone cannot tell 0 from 256).
std::vector<std::byte> message(uint16_t device, uint32_t index, size_t n = kMessage) {
  auto b = pattern(device, index, n);
  std::memcpy(b.data(), &index, sizeof index);
  return b;
}

uint32_t index_of(std::span<const std::byte> d) {
  uint32_t i = 0;
  std::memcpy(&i, d.data(), sizeof i);
  return i;
}

struct Pair {
  std::unique_ptr<ViewWorkers> workers;
  std::unique_ptr<Receiver> rx;
  std::unique_ptr<Sender> tx;
  std::mutex mu;
  std::vector<SessionReport> ended;
  std::vector<std::string> events;

  Pair(Transport t, ViewWorkersOptions wo, std::vector<uint16_t> devices) {
    wo.on_event = [this](const std::string& e) {
      std::lock_guard lock(mu);
      events.push_back(e);
    };
    EXPECT_TRUE(ViewWorkers::start(std::move(wo), &workers).is_ok());
    ReceiverOptions ro;
    ro.host = "127.0.0.1";
    ro.transport = t;
    ro.make_view_sink = workers->view_sink();
    ro.on_session_end = [this](const SessionReport& r) {
      std::lock_guard lock(mu);
      ended.push_back(r);
    };
    Status st = Receiver::start(ro, &rx);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    SenderOptions so;
    so.host = "127.0.0.1";
    const std::string a = rx->listen_address();
    so.port = uint16_t(std::stoi(a.substr(a.rfind(':') + 1)));
    so.name = "cams";
    so.transport = t;
    so.blocks = kBlocks;
    so.block_size = kBlockSize;
    so.devices = std::move(devices);
    st = Sender::connect(so, &tx);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
  }
  // Sends `n` messages on each device (one thread per device), each within `deadline`.
  void send_all(uint32_t n, std::chrono::seconds deadline = 20s) {
    std::vector<std::thread> fillers;
    for (uint16_t d : tx_devices()) {
      fillers.emplace_back([this, d, n, deadline] {
        for (uint32_t i = 0; i < n; ++i) {
          DeviceStream::Progress p;
          Status st = tx->device(d)->send(message(d, i), std::chrono::steady_clock::now() + deadline, &p);
          ASSERT_TRUE(st.is_ok()) << "device " << d << " message " << i << ": " << st.to_string();
        }
      });
    }
    for (auto& f : fillers) f.join();
  }
  std::vector<uint16_t> tx_devices() const {
    std::vector<uint16_t> out;
    for (uint16_t d = 0; d < 4; ++d) {
      if (tx->device(d)) out.push_back(d);
    }
    return out;
  }
  // Sender finished (every message taken by the workers' sink), workers idle, session report.
  SessionReport finish() {
    Status st = tx->finish();
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    EXPECT_TRUE(workers->wait_idle(10s));
    rx->wait_sessions(1);
    std::lock_guard lock(mu);
    return ended.empty() ? SessionReport{} : ended.front();
  }
  ~Pair() {
    tx.reset();
    if (rx) rx->stop();
    workers->stop();
  }
};

class ViewWorkersTest : public ::testing::TestWithParam<Transport> {};

// Every message reaches its device's worker in order, byte-exact, in place, on one thread per device.
TEST_P(ViewWorkersTest, EveryMessageInOrderByteExactOneThreadPerDevice) {
  struct Seen {
    uint32_t next = 0, bad = 0, out_of_order = 0, in_place = 0;
    std::set<std::thread::id> threads;
  };
  std::mutex mu;
  std::map<uint16_t, Seen> seen;
  ViewWorkersOptions o;
  o.make_worker = [&](const std::string& sender, uint16_t device, ViewWorker* out) {
    EXPECT_EQ(sender, "cams");
    *out = [&, device](MessageView& v) {
      std::lock_guard lock(mu);
      Seen& s = seen[device];
      s.threads.insert(std::this_thread::get_id());
      const uint32_t i = index_of(v.data());
      if (i != s.next) ++s.out_of_order;
      s.next = i + 1;
      auto want = message(device, i);
      if (!std::equal(want.begin(), want.end(), v.data().begin(), v.data().end())) ++s.bad;
      if (!v.copied() && v.in_registered_memory()) ++s.in_place;
      return Status::ok();
    };
    return Status::ok();
  };
  constexpr uint32_t kN = 150;
  Pair p(GetParam(), o, {0, 1, 2});
  p.send_all(kN);
  SessionReport r = p.finish();
  EXPECT_EQ(r.messages, 3 * kN);
  EXPECT_EQ(r.gaps, 0u);
  std::set<std::thread::id> all;
  for (uint16_t d : {0, 1, 2}) {
    Seen& s = seen[d];
    EXPECT_EQ(s.next, kN) << "device " << d;
    EXPECT_EQ(s.bad, 0u) << "device " << d;
    EXPECT_EQ(s.out_of_order, 0u) << "device " << d;
    EXPECT_EQ(s.in_place, kN) << "device " << d << ": every view in its receive block";
    EXPECT_EQ(s.threads.size(), 1u) << "device " << d;
    all.insert(s.threads.begin(), s.threads.end());
  }
  EXPECT_EQ(all.size(), 3u) << "a thread per device";
  for (const auto& st : p.workers->stats()) EXPECT_EQ(st.processed, kN);
}

// A worker that keeps its views holds their blocks: at the held limit the receiver lends no more and
// the sender waits; once the views are released, everything arrives, in order, nothing lost.
TEST_P(ViewWorkersTest, WorkerHoldingViewsBackPressuresWithoutLoss) {
  std::mutex mu;
  std::vector<MessageView> kept;
  std::atomic<uint32_t> taken{0}, next{0}, out_of_order{0};
  ViewWorkersOptions o;
  o.make_worker = [&](const std::string&, uint16_t, ViewWorker* out) {
    *out = [&](MessageView& v) {
      if (index_of(v.data()) != next++) ++out_of_order;
      ++taken;
      std::lock_guard lock(mu);
      kept.push_back(std::move(v));  // still held: the block stays status 2
      return Status::ok();
    };
    return Status::ok();
  };
  constexpr uint32_t kN = 40;
  Pair p(GetParam(), o, {0});
  std::thread filler([&] { p.send_all(kN); });
  // The worker holds the held limit's blocks (kBlocks / 2) and gets nothing more while it keeps them.
  for (int i = 0; i < 2000 && taken < kBlocks / 2; ++i) std::this_thread::sleep_for(10ms);
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(taken.load(), kBlocks / 2) << "the held limit stops lending";
  auto live = p.rx->live_sessions();
  ASSERT_EQ(live.size(), 1u);
  EXPECT_EQ(live[0].views_held_blocks, kBlocks / 2);
  // Released from this thread, a few at a time, until the stream is through.
  while (taken < kN) {
    {
      std::lock_guard lock(mu);
      EXPECT_LE(kept.size(), kBlocks / 2);
      kept.clear();
    }
    std::this_thread::sleep_for(5ms);
  }
  filler.join();
  {
    std::lock_guard lock(mu);
    kept.clear();
  }
  SessionReport r = p.finish();
  EXPECT_EQ(r.messages, kN);
  EXPECT_EQ(r.gaps, 0u);
  EXPECT_GT(r.view_limit_waits, 0u);
  EXPECT_EQ(out_of_order.load(), 0u);
}

// A worker that fails — returns an error or throws — releases its views: the failed message's and
// every one it kept in its state (the worker is destroyed; a fresh one takes the next message). It
// keeps up to 3 views, one short of the held limit: were they not released with the worker, the
// 4th kept view would reach the limit and the stream would stall (the sends' deadline fails it).
TEST_P(ViewWorkersTest, FailingWorkerReleasesItsViews) {
  std::atomic<uint32_t> made{0}, next{0}, out_of_order{0};
  ViewWorkersOptions o;
  o.make_worker = [&](const std::string&, uint16_t, ViewWorker* out) {
    ++made;
    auto kept = std::make_shared<std::vector<MessageView>>();
    *out = [&, kept](MessageView& v) -> Status {
      const uint32_t i = index_of(v.data());
      if (i != next++) ++out_of_order;
      if (i % 8 == 3) return {Code::kIoError, "cannot analyse frame " + std::to_string(i)};
      if (i % 8 == 7) throw std::runtime_error("frame " + std::to_string(i) + " is not a frame");
      kept->push_back(std::move(v));  // kept until the worker goes
      return Status::ok();
    };
    return Status::ok();
  };
  constexpr uint32_t kN = 48;
  Pair p(GetParam(), o, {0});
  p.send_all(kN, 10s);
  SessionReport r = p.finish();
  EXPECT_EQ(r.messages, kN);
  auto stats = p.workers->stats();
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_EQ(stats[0].failed, kN / 4);
  EXPECT_EQ(stats[0].processed, kN - kN / 4);
  EXPECT_EQ(stats[0].restarts, kN / 4 - 1) << "the last message failed: no worker made after it";
  EXPECT_EQ(made.load(), kN / 4);
  EXPECT_EQ(out_of_order.load(), 0u);
  std::lock_guard lock(p.mu);
  ASSERT_FALSE(p.events.empty());
  EXPECT_NE(p.events[0].find("failed on packet"), std::string::npos) << p.events[0];
  EXPECT_NE(p.events[0].find("cannot analyse frame 3"), std::string::npos) << p.events[0];
}

// A device whose worker is behind (backlog_messages queued) is paused alone: the other device's messages keep
// flowing past it, and the slow device's arrive later, all of them, in order.
TEST_P(ViewWorkersTest, SlowDevicePausesAlone) {
  std::mutex mu;
  std::map<uint16_t, uint32_t> next, out_of_order;
  std::map<uint16_t, std::chrono::steady_clock::time_point> last;
  ViewWorkersOptions o;
  o.backlog_messages = 2;
  o.make_worker = [&](const std::string&, uint16_t device, ViewWorker* out) {
    *out = [&, device](MessageView& v) {
      if (device == 0) std::this_thread::sleep_for(25ms);  // the slow analysis: 1 s for the stream
      std::lock_guard lock(mu);
      if (index_of(v.data()) != next[device]++) ++out_of_order[device];
      last[device] = std::chrono::steady_clock::now();
      return Status::ok();
    };
    return Status::ok();
  };
  constexpr uint32_t kN = 40;
  Pair p(GetParam(), o, {0, 1});
  p.send_all(kN);
  SessionReport r = p.finish();
  EXPECT_EQ(r.messages, 2 * kN);
  EXPECT_EQ(r.gaps, 0u);
  std::lock_guard lock(mu);
  EXPECT_EQ(next[0], kN);
  EXPECT_EQ(next[1], kN);
  EXPECT_EQ(out_of_order[0] + out_of_order[1], 0u);
  EXPECT_LT(last[1] + 400ms, last[0]) << "the fast device finished long before the slow one";
  uint64_t busy = 0;
  for (const auto& st : p.workers->stats()) busy += st.device == 0 ? st.busy : 0;
  EXPECT_GT(busy, 0u) << "the slow device was paused at its backlog";
  // Device 1 may be paused too, briefly, when its thread is not scheduled in time (a loaded machine); what
  // tells the devices apart is when each finished.
  EXPECT_GT(r.per_device[0].pauses, 0u);
}

INSTANTIATE_TEST_SUITE_P(Transports, ViewWorkersTest, ::testing::Values(Transport::kShm, Transport::kTcp),
                         [](const auto& info) { return std::string(transport_name(info.param)); });

TEST(ViewWorkers, NeedsMakeWorker) {
  std::unique_ptr<ViewWorkers> w;
  Status st = ViewWorkers::start({}, &w);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_FALSE(w);
}

}  // namespace
}  // namespace slotstream
