#include "platform/reservation.h"

#include <random>
#include <thread>

#include "platform/scheduler.h"

namespace slotstream::platform {

using Clock = std::chrono::steady_clock;

Status read_platform(EtcdClient& etcd, std::vector<ReceiverRecord>* receivers, std::vector<Reservation>* reservations,
                     int64_t* revision, std::vector<std::string>* skipped) {
  std::vector<KeyValue> kvs;
  SLOTSTREAM_RETURN_IF_ERROR(etcd.range_prefix(kPrefix, &kvs, revision));
  receivers->clear();
  reservations->clear();
  if (skipped) skipped->clear();
  auto skip = [skipped](const KeyValue& kv, const std::string& why) {
    if (skipped) skipped->push_back("skipped " + kv.key.substr(0, 160) + ": " + why);
  };
  const std::string rp = receivers_prefix(), sp = reservations_prefix();
  for (const auto& kv : kvs) {
    if (kv.key.starts_with(rp)) {
      ReceiverRecord r;
      if (Status st = decode(kv.value, &r); !st.is_ok()) {
        skip(kv, st.message());
      } else if (kv.key != receiver_key(r.name)) {
        skip(kv, "the record names receiver '" + r.name + "', not its key's");
      } else if (kv.lease == 0) {
        // A receiver's record lives under its lease and goes with it; one without would send senders
        // to an address nobody keeps alive (or to whoever wrote it).
        skip(kv, "a receiver record without a lease (not written by a receiver)");
      } else {
        r.registered_revision = kv.create_revision;
        receivers->push_back(std::move(r));
      }
    } else if (kv.key.starts_with(sp)) {
      Reservation r;
      if (Status st = decode(kv.value, &r); !st.is_ok()) {
        skip(kv, st.message());
      } else if (kv.key != reservation_key(r.receiver, r.sender)) {
        skip(kv, "the reservation names " + r.receiver + "/" + r.sender + ", not its key's");
      } else {
        reservations->push_back(std::move(r));
      }
    }
  }
  return Status::ok();
}

Status SenderLease::start(const EtcdConfig& etcd, const std::string& sender, int64_t ttl_seconds,
                          std::function<void(const std::string&)> on_event, std::unique_ptr<SenderLease>* out) {
  if (auto why = invalid_platform_name(sender))
    return {Code::kInvalidArgument, "sender name '" + sender + "': " + *why};
  std::unique_ptr<SenderLease> s(new SenderLease(sender, std::move(on_event)));
  SLOTSTREAM_RETURN_IF_ERROR(EtcdClient::create(etcd, &s->etcd_));
  KeptLease::Options lo;
  lo.etcd = etcd;
  lo.ttl_seconds = ttl_seconds;
  lo.tick_every = std::chrono::milliseconds(ttl_seconds * 1000);
  lo.on_event = s->on_event_;
  SenderLease* self = s.get();
  lo.regained = [self](int64_t lease) { self->regained(lease); };
  SLOTSTREAM_RETURN_IF_ERROR(KeptLease::start(std::move(lo), &s->lease_));
  *out = std::move(s);
  return Status::ok();
}

SenderLease::~SenderLease() { lease_.reset(); }

// The lease ran out while etcd was out of reach, and the reservation with it: put it back, on the
// same receiver, if it still has room (otherwise the stream goes on unreserved, and says so).
void SenderLease::regained(int64_t) {
  Request r;
  {
    std::lock_guard lock(mutex_);
    if (reserved_on_.empty()) return;
    r.amount = reservation_.amount;
    r.devices = reservation_.devices;
    reserved_on_.clear();
  }
  Placement p;
  if (Status st = reserve(r, &p); !st.is_ok() && on_event_) {
    on_event_("the reservation lapsed with the lease and could not be made again: " + st.message());
  }
}

Status SenderLease::try_reserve(const Request& request, Placement* out, bool* conflict) {
  *conflict = false;
  std::vector<ReceiverRecord> records;
  std::vector<Reservation> reservations;
  int64_t revision = 0;
  std::vector<std::string> skipped;
  SLOTSTREAM_RETURN_IF_ERROR(read_platform(*etcd_, &records, &reservations, &revision, &skipped));
  for (const auto& line : skipped) {
    bool fresh = false;
    {
      std::lock_guard lock(mutex_);
      fresh = said_.insert(line).second;
    }
    if (fresh && on_event_) on_event_("warning: platform: " + line);
  }
  std::set<std::string> exclude = request.exclude;
  if (!request.only.empty()) {
    for (const auto& r : records) {
      if (r.name != request.only) exclude.insert(r.name);
    }
  }
  std::vector<ReceiverView> views = build_views(records, reservations, sender_);
  {
    // In place, the receive memory this sender's connection holds there already is its own.
    std::lock_guard lock(mutex_);
    for (auto& v : views) {
      if (!request.only.empty() && v.record.name == reserved_on_) {
        v.record.free_receive_memory += uint64_t(reservation_.amount.memory);
      }
    }
  }
  const Decision d = choose(views, request.amount, exclude, request.transport);
  if (!d.ok) return {Code::kRefused, d.why};
  Reservation res{sender_, d.receiver, request.amount, request.devices};
  int64_t registered = 0;
  for (const auto& r : records) {
    if (r.name == d.receiver) registered = r.registered_revision;
  }
  // The receiver is still the registration chosen from (not gone, nor replaced by another under its
  // name), and nobody reserved on it since the read.
  std::vector<Compare> compares = {
      {receiver_key(d.receiver), "", Compare::Target::kCreate, Compare::Result::kEqual, registered},
      {reservations_prefix(d.receiver), prefix_end(reservations_prefix(d.receiver)), Compare::Target::kMod,
       Compare::Result::kLess, revision + 1}};
  std::vector<Op> ops = {{Op::Kind::kPut, reservation_key(d.receiver, sender_), encode(res), lease_->id()}};
  std::lock_guard lock(mutex_);
  if (!reserved_on_.empty() && reserved_on_ != d.receiver) {
    ops.push_back({Op::Kind::kDelete, reservation_key(reserved_on_, sender_)});
  }
  bool ok = false;
  SLOTSTREAM_RETURN_IF_ERROR(etcd_->txn(compares, ops, &ok));
  if (!ok) {
    *conflict = true;
    return Status::ok();
  }
  reserved_on_ = d.receiver;
  reservation_ = res;
  for (const auto& r : records) {
    if (r.name == d.receiver) out->address = r.address;
  }
  out->registered_revision = registered;
  out->receiver = d.receiver;
  out->why = d.why;
  return Status::ok();
}

Status SenderLease::reserve(const Request& request, Placement* out) {
  if (auto why = invalid_amount(request.amount)) return {Code::kInvalidArgument, "the amount to reserve: " + *why};
  std::mt19937 rng(std::random_device{}());
  const auto deadline = Clock::now() + request.patience;
  for (int attempt = 1;; ++attempt) {
    bool conflict = false;
    SLOTSTREAM_RETURN_IF_ERROR(try_reserve(request, out, &conflict));
    if (!conflict) {
      out->attempts = attempt;
      return Status::ok();
    }
    if (Clock::now() > deadline) {
      return {Code::kTimeout, "could not reserve for " + std::to_string(attempt) +
                                  " tries: other senders kept reserving the same receivers"};
    }
    // Another requester reserved on the same receiver since our read: read again, after a short
    // random pause so that requesters that collided do not collide again in step.
    std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 5 * attempt)(rng)));
  }
}

Status SenderLease::release() {
  std::lock_guard lock(mutex_);
  if (reserved_on_.empty()) return Status::ok();
  Status st = etcd_->remove(reservation_key(reserved_on_, sender_));
  if (st.is_ok()) reserved_on_.clear();
  return st;
}

}  // namespace slotstream::platform
