// An etcd lease that this process keeps alive for as long as it lives (paper §3.1's resource
// status "of each edge server": a receiver's record, a sender's reservation, disappear with the
// process that holds them). A thread of its own sends a keep-alive every third of the TTL —
// through a client of its own, so a slow request elsewhere never delays it — and calls `tick`
// between keep-alives for the owner's periodic work (a receiver refreshes its record).
//
// When the lease could not be renewed for longer than the TTL (etcd out of reach, or this process
// stopped), it is gone and its keys with it: the thread grants a new lease and calls `regained` so
// that the owner writes its keys again (where they are still its to write: registration.h).
// Destroying a KeptLease revokes the lease, so its keys go at once rather than after the TTL.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "platform/etcd.h"

namespace slotstream::platform {

class KeptLease {
 public:
  struct Options {
    EtcdConfig etcd;
    int64_t ttl_seconds = 5;
    std::chrono::milliseconds tick_every{1000};
    std::function<void(int64_t lease)> regained;  // the lease thread; may be empty
    std::function<void(int64_t lease)> tick;      // the lease thread; may be empty
    std::function<void(const std::string&)> on_event;
  };
  static Status start(Options options, std::unique_ptr<KeptLease>* out);
  ~KeptLease();  // stops the thread and revokes the lease
  KeptLease(const KeptLease&) = delete;
  KeptLease& operator=(const KeptLease&) = delete;

  int64_t id() const { return id_.load(std::memory_order_acquire); }
  // Stops keeping it alive without revoking it: the keys live on until the TTL runs out, as if
  // this process had died (used when the owner hands over, and by tests). Any thread.
  void abandon();

 private:
  explicit KeptLease(Options options) : options_(std::move(options)) {}
  void run();
  void keep_alive();
  void stop_thread();

  Options options_;
  std::unique_ptr<EtcdClient> etcd_;
  std::atomic<int64_t> id_{0};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  bool abandoned_ = false;
  std::thread thread_;
};

}  // namespace slotstream::platform
