// A receiver on the platform (`slotstream recv --platform etcd://...`): its record under
// /slotstream/v1/receivers/<name>, held by a lease it keeps alive and refreshed with what it
// measures about every second (free CPU, memory, receive memory, senders, backlog). When the
// receiver dies its lease runs out and the record is gone; when it stops, it is removed at once.
//
// The name is one receiver's at a time. The record is created only where none exists, and every
// refresh is a transaction that writes it only while it is still the one this receiver created
// (its create revision). A receiver whose lease ran out (stopped, or cut off from etcd, for
// longer than its TTL) creates it again only if nobody took the name meanwhile; if somebody did,
// this receiver has lost the name for good (lost(), on_lost): it must leave rather than write over
// the other one's record every second.
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
  EtcdConfig etcd;
  ReceiverRecord record;  // name, address, transports, host id, capacity
  int64_t ttl_seconds = 5;
  std::chrono::milliseconds refresh{1000};
  // Fills in the measured fields (free_*, senders, backlog_bytes) before each write. Called from
  // the registration's thread.
  std::function<void(ReceiverRecord*)> measure;
  std::function<void(const std::string&)> on_event;
  // Another receiver holds the name now (see above): called once, from the lease thread, with
  // what happened. The receiver should stop (its senders then move on).
  std::function<void(const std::string&)> on_lost;
};

class Registration {
 public:
  // Refuses (kRefused) a name another live receiver holds, and (kInvalidArgument) a record that
  // other processes would skip as bad (invalid_record).
  static Status start(RegistrationOptions options, std::unique_ptr<Registration>* out);
  ~Registration();  // removes the record at once (revokes the lease)
  // Stops renewing, as if the process had died: the record goes when the TTL runs out.
  void abandon();
  // Another receiver took the name (on_lost was called). Any thread.
  bool lost() const { return lost_.load(); }

 private:
  explicit Registration(RegistrationOptions options) : options_(std::move(options)) {}
  // Refreshes the record while it is ours; creates it again if it went with an expired lease.
  Status write(int64_t lease);
  ReceiverRecord measured();

  RegistrationOptions options_;
  std::mutex mutex_;  // one write at a time (the lease thread; start)
  std::unique_ptr<EtcdClient> etcd_;
  std::unique_ptr<KeptLease> lease_;
  int64_t created_ = 0;                  // create revision of our record (under mutex_)
  std::atomic<bool> registered_{false};  // the record is ours: the lease thread may write it
  std::atomic<bool> lost_{false};
};

}  // namespace slotstream::platform
