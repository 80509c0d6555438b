// Every registered protocol, over real UCX on every transport this machine has (shared memory
// and tcp): a receiver and a sender in one process, several devices filled concurrently, sizes
// from empty to several blocks, many more messages than blocks (wrap-around), each message
// compared byte for byte and in order. A new protocol is tested here by registering it.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "protocol/protocol.h"
#include "slotstream/slotstream.h"
#include "wire/block_header.h"

namespace slotstream {
namespace {

// Keeps every message in memory, per device, in order. A sender with one connection per device
// (sliding_window) has one sink per connection, each called from its own session thread: `out`
// is shared, so it is written under `mutex`.
class MemorySink : public MessageSink {
 public:
  // `threads` (guarded by `m`): every thread that ever committed a message, for round-robin checks.
  MemorySink(std::map<uint16_t, std::vector<std::string>>& out, std::mutex& m, std::set<std::thread::id>& threads)
      : out_(out),
        mutex_(m),
        threads_(threads) {}
  Status begin(uint16_t device) override {
    current_[device].clear();
    return Status::ok();
  }
  Status append(uint16_t device, std::span<const std::byte> d) override {
    current_[device].append(reinterpret_cast<const char*>(d.data()), d.size());
    return Status::ok();
  }
  Status commit(uint16_t device) override {
    std::lock_guard lock(mutex_);
    threads_.insert(std::this_thread::get_id());
    out_[device].push_back(std::move(current_[device]));
    current_[device].clear();
    return Status::ok();
  }
  void abort(uint16_t device) override { current_[device].clear(); }

 private:
  std::map<uint16_t, std::vector<std::string>>& out_;
  std::mutex& mutex_;
  std::set<std::thread::id>& threads_;
  std::map<uint16_t, std::string> current_;
};

// Message i of device d: its length follows `sizes`, its bytes depend on (d, i, offset).
std::string message(uint16_t d, size_t i, size_t length) {
  std::string m(length, '\0');
  std::mt19937 rng(uint32_t(d) * 1000003u + uint32_t(i));  // unsigned: wraps, never overflows
  for (auto& c : m) c = char(rng());
  return m;
}

struct Case {
  std::string protocol;
  Transport transport;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.protocol << " over " << transport_name(c.transport); }

std::string case_name(const testing::TestParamInfo<Case>& info) {
  return info.param.protocol + "_" + transport_name(info.param.transport);
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const auto* d : protocol::all()) {
    if (d->reference) continue;  // delivers nothing by design
    for (Transport t : {Transport::kShm, Transport::kTcp}) out.push_back({std::string(d->name), t});
  }
  return out;
}

class EveryProtocol : public testing::TestWithParam<Case> {
 protected:
  // Streams `per_device` messages on each device with the given sizes (cycled) and checks them.
  // With `senders` > 1 that many senders stream the same at once (their own names, their own
  // sinks); `round_robin`: one receiver thread serves them all (ReceiverOptions::round_robin).
  void stream(uint32_t blocks, uint32_t block_size, const std::vector<size_t>& sizes, size_t per_device,
              std::vector<uint16_t> devices, int senders = 1, bool round_robin = false) {
    std::mutex m;
    std::map<std::string, std::map<uint16_t, std::vector<std::string>>> received;
    std::set<std::thread::id> sink_threads;
    ReceiverOptions ro;
    ro.host = "127.0.0.1";
    ro.transport = GetParam().transport;
    ro.round_robin = round_robin;
    ro.make_sink = [&](const SenderInfo& info, std::unique_ptr<MessageSink>* sink) {
      std::lock_guard lock(m);
      *sink = std::make_unique<MemorySink>(received[info.name], m, sink_threads);
      return Status::ok();
    };
    std::vector<SessionReport> reports;
    ro.on_session_end = [&](const SessionReport& r) {
      std::lock_guard lock(m);
      reports.push_back(r);
    };
    std::unique_ptr<Receiver> rx;
    ASSERT_TRUE(Receiver::start(ro, &rx).is_ok());
    const std::string addr = rx->listen_address();

    std::vector<std::unique_ptr<Sender>> txs(senders);
    for (int n = 0; n < senders; ++n) {
      SenderOptions so;
      so.host = "127.0.0.1";
      so.port = uint16_t(std::stoi(addr.substr(addr.rfind(':') + 1)));
      so.name = "proto-test-" + std::to_string(n);
      so.protocol = GetParam().protocol;
      so.transport = GetParam().transport;
      so.blocks = blocks;
      so.block_size = block_size;
      so.devices = devices;
      Status st = Sender::connect(so, &txs[n]);
      ASSERT_TRUE(st.is_ok()) << st.to_string();
    }

    // Like `send`'s progress display: stats() from another thread all along, finish() included.
    // Under ThreadSanitizer (scripts/sanitize.sh) this checks Sender's threading contract.
    std::atomic<bool> watching{true};
    std::thread watcher([&] {
      while (watching.load()) {
        for (auto& t : txs) (void)t->stats();
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    });
    struct StopWatching {
      std::atomic<bool>& flag;
      std::thread& thread;
      ~StopWatching() {
        flag.store(false);
        thread.join();
      }
    } stop_watching{watching, watcher};

    std::vector<std::thread> fillers;
    std::vector<Status> errors(devices.size() * senders);
    for (int n = 0; n < senders; ++n) {
      for (size_t k = 0; k < devices.size(); ++k) {
        fillers.emplace_back([&, n, k] {
          const uint16_t d = devices[k];
          Status& err = errors[n * devices.size() + k];
          for (size_t i = 0; i < per_device && err.is_ok(); ++i) {
            std::string msg = message(d, i, sizes[(i + k) % sizes.size()]);
            err = txs[n]->device(d)->send(std::as_bytes(std::span(msg)));
          }
        });
      }
    }
    for (auto& t : fillers) t.join();
    for (const Status& e : errors) ASSERT_TRUE(e.is_ok()) << e.to_string();
    for (auto& tx : txs) {
      Status st = tx->finish();
      ASSERT_TRUE(st.is_ok()) << st.to_string();
    }
    rx->wait_sessions(senders);
    rx->stop();

    const uint32_t capacity = block_size - wire::kBlockHeaderSize;
    for (int n = 0; n < senders; ++n) {
      auto& got = received["proto-test-" + std::to_string(n)];
      uint64_t fragments = 0;
      for (size_t k = 0; k < devices.size(); ++k) {
        const uint16_t d = devices[k];
        ASSERT_EQ(got[d].size(), per_device) << "sender " << n << " device " << d;
        for (size_t i = 0; i < per_device; ++i) {
          const size_t len = sizes[(i + k) % sizes.size()];
          fragments += len == 0 ? 1 : (len + capacity - 1) / capacity;
          ASSERT_EQ(got[d][i], message(d, i, len)) << "sender " << n << " device " << d << " message " << i;
        }
      }
      SenderStats s = txs[n]->stats();
      EXPECT_EQ(s.messages, per_device * devices.size());
      EXPECT_EQ(s.records, fragments) << "one record per fragment";
      EXPECT_EQ(s.waits, s.wait_samples_ns.size());
    }
    if (round_robin) {
      EXPECT_EQ(sink_threads.size(), 1u) << "every sender served by the one round-robin thread";
    } else if (senders > 1) {
      // One per connection: a thread per sender, or per device where devices cannot share one.
      EXPECT_GE(sink_threads.size(), size_t(senders)) << "a consumer thread per sender";
    }
    ASSERT_EQ(reports.size(), size_t(senders));
    for (const SessionReport& r : reports) {
      EXPECT_TRUE(r.finished) << r.reason;
      EXPECT_EQ(r.gaps, 0u);
      EXPECT_EQ(r.duplicates, 0u);
    }
  }
};

TEST_P(EveryProtocol, SizesFromEmptyToSeveralBlocksOnThreeDevicesWrapAround) {
  const uint32_t bs = 4096, cap = bs - wire::kBlockHeaderSize;
  stream(4, bs, {0, 1, 100, cap - 1, cap, cap + 1, 3 * cap + 7}, 120, {0, 5, 65535});
}

TEST_P(EveryProtocol, ManySmallMessagesInTinyBlocks) { stream(3, 64, {1, 8, 47, 48, 49}, 400, {1, 2}); }

TEST_P(EveryProtocol, OneDeviceOneBlock) { stream(1, 1024, {10, 1008, 3000}, 60, {7}); }

TEST_P(EveryProtocol, ThreeSendersIntoOneRoundRobinConsumer) {
  stream(4, 2048, {0, 100, 2032, 5000}, 40, {0, 1}, /*senders=*/3, /*round_robin=*/true);
}

TEST_P(EveryProtocol, ThreeSendersEachWithAConsumerThreadOfItsOwn) {
  stream(4, 2048, {0, 100, 2032, 5000}, 40, {0, 1}, /*senders=*/3, /*round_robin=*/false);
}

INSTANTIATE_TEST_SUITE_P(Registered, EveryProtocol, testing::ValuesIn(cases()), case_name);

}  // namespace
}  // namespace slotstream
