// A sender on the platform (paper §3.1: the edge server "sends a resource scheduling request ...
// the platform then responds with a resource scheduling result"): a lease the sender keeps alive,
// and at most one reservation under it, /slotstream/v1/reservations/<receiver>/<sender>.
//
// reserve() reads the whole platform state at one revision, lets the scheduler choose
// (scheduler.h), and writes the reservation in one transaction that holds only if no reservation
// under the chosen receiver changed since that revision (compare on the mod revision of its whole
// prefix) and the receiver is still registered; otherwise it reads again. So two requesters that
// chose the same receiver from the same view cannot both pass: the second reads the first's
// reservation and chooses again. Moving (a receiver died, the devices changed) deletes the old
// reservation in the same transaction. The reservation goes with the sender: release() or the
// destructor at once, a dead process's when its lease runs out.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "platform/lease.h"
#include "platform/model.h"

namespace slotstream::platform {

struct Placement {
  std::string receiver;
  std::string address;              // the receiver's control address HOST:PORT
  std::string why;                  // the scheduler's reason
  int attempts = 0;                 // transactions it took (more than 1: others reserved at the same time)
  int64_t registered_revision = 0;  // etcd's create revision of the receiver's record: its registration
};

struct Request {
  Amount amount;
  std::vector<uint16_t> devices;
  std::string transport;          // "" any; else one the receiver must serve
  std::set<std::string> exclude;  // receivers not to choose (just lost)
  // Non-empty: this receiver or none — the reservation changes in place (the edge's per-device
  // moves keep their connection); kRefused when it has no room.
  std::string only;
  std::chrono::milliseconds patience{5000};  // how long to retry conflicting transactions
};

class SenderLease {
 public:
  static Status start(const EtcdConfig& etcd, const std::string& sender, int64_t ttl_seconds,
                      std::function<void(const std::string&)> on_event, std::unique_ptr<SenderLease>* out);
  ~SenderLease();  // revokes the lease: the reservation goes at once

  // Chooses a receiver for `request` and reserves it (replacing this sender's reservation, if
  // any). kRefused with every receiver's shortfall when none has room; kTimeout when conflicting
  // transactions went on for longer than `patience`; kInvalidArgument for an amount out of range
  // (invalid_amount). Records skipped as bad are said through on_event, once each.
  Status reserve(const Request& request, Placement* out);
  // Deletes the reservation (the sender goes on, unscheduled).
  Status release();
  const std::string& sender() const { return sender_; }

 private:
  SenderLease(std::string sender, std::function<void(const std::string&)> on_event)
      : sender_(std::move(sender)),
        on_event_(std::move(on_event)) {}
  Status try_reserve(const Request& request, Placement* out, bool* conflict);
  void regained(int64_t lease);

  std::string sender_;
  std::function<void(const std::string&)> on_event_;
  std::unique_ptr<EtcdClient> etcd_;
  std::unique_ptr<KeptLease> lease_;
  std::mutex mutex_;         // guards the reservation
  std::string reserved_on_;  // receiver of the current reservation ("" none)
  Reservation reservation_;
  std::set<std::string> said_;  // skipped records already said (under mutex_)
};

// Reads the platform: every registered receiver and every reservation, at one revision. A value
// that is not what slotstream writes (malformed, out of range, under another name's key, a
// receiver record without a lease) is skipped, and `*skipped` (may be null) says which and why.
Status read_platform(EtcdClient& etcd, std::vector<ReceiverRecord>* receivers, std::vector<Reservation>* reservations,
                     int64_t* revision, std::vector<std::string>* skipped = nullptr);

}  // namespace slotstream::platform
