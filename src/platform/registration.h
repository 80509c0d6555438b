// A receiver on the platform (`slotstream recv --platform etcd://...`): its record under
// /slotstream/v1/receivers/<name>, held by a lease it keeps alive and refreshed with what it
// measures about every second (free CPU, memory, receive memory, senders, backlog). When the
// receiver dies its lease runs out and the record is gone; when it stops, it is removed at once.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "platform/lease.h"
#include "platform/model.h"

namespace slotstream::platform {

struct RegistrationOptions {
  std::vector<std::string> endpoints;
  ReceiverRecord record;  // name, address, transports, host id, capacity
  int64_t ttl_seconds = 5;
  std::chrono::milliseconds refresh{1000};
  // Fills in the measured fields (free_*, senders, backlog_bytes) before each write. Called from
  // the registration's thread.
  std::function<void(ReceiverRecord*)> measure;
  std::function<void(const std::string&)> on_event;
};

class Registration {
 public:
  // Refuses (kRefused) a name another live receiver holds.
  static Status start(RegistrationOptions options, std::unique_ptr<Registration>* out);
  ~Registration();  // removes the record at once (revokes the lease)
  // Stops renewing, as if the process had died: the record goes when the TTL runs out.
  void abandon();

 private:
  explicit Registration(RegistrationOptions options) : options_(std::move(options)) {}
  Status write(int64_t lease);

  RegistrationOptions options_;
  std::mutex mutex_;  // one write at a time (the lease thread; start)
  std::unique_ptr<EtcdClient> etcd_;
  std::unique_ptr<KeptLease> lease_;
  std::atomic<bool> registered_{false};  // the record is ours: the lease thread may write it
};

}  // namespace slotstream::platform
