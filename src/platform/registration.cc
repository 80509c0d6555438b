#include "platform/registration.h"

namespace slotstream::platform {

namespace {

int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Creates `key` only where it does not exist; *created says, *revision is its create revision.
Status create_record(EtcdClient& etcd, const std::string& key, const std::string& value, int64_t lease, bool* created,
                     int64_t* revision) {
  return etcd.txn({{key, "", Compare::Target::kVersion, Compare::Result::kEqual, 0}},
                  {{Op::Kind::kPut, key, value, lease}}, created, revision);
}

}  // namespace

Status Registration::start(RegistrationOptions options, std::unique_ptr<Registration>* out) {
  if (auto why = invalid_platform_name(options.record.name)) {
    return {Code::kInvalidArgument, "receiver name '" + options.record.name + "': " + *why};
  }
  std::unique_ptr<Registration> r(new Registration(std::move(options)));
  // What others would skip as a forgery is refused here, before it is published.
  if (auto why = invalid_record(r->measured())) return {Code::kInvalidArgument, "this receiver's record: " + *why};
  SLOTSTREAM_RETURN_IF_ERROR(EtcdClient::create(r->options_.etcd, &r->etcd_));
  KeptLease::Options lo;
  lo.etcd = r->options_.etcd;
  lo.ttl_seconds = r->options_.ttl_seconds;
  lo.tick_every = r->options_.refresh;
  lo.on_event = r->options_.on_event;
  Registration* self = r.get();
  lo.regained = [self](int64_t lease) {
    if (!self->registered_.load()) return;
    if (Status st = self->write(lease); !st.is_ok() && self->options_.on_event) {
      self->options_.on_event("cannot register again: " + st.message());
    }
  };
  lo.tick = [self](int64_t lease) {
    if (!self->registered_.load()) return;
    if (Status st = self->write(lease); !st.is_ok() && self->options_.on_event) {
      self->options_.on_event("cannot refresh the platform record: " + st.message());
    }
  };
  // The record is created only where no live receiver holds the name: a second receiver started
  // with the same name must not take over the first one's senders.
  std::unique_ptr<KeptLease> lease;
  SLOTSTREAM_RETURN_IF_ERROR(KeptLease::start(std::move(lo), &lease));
  const ReceiverRecord rec = r->measured();
  bool created = false;
  SLOTSTREAM_RETURN_IF_ERROR(
      create_record(*r->etcd_, receiver_key(rec.name), encode(rec), lease->id(), &created, &r->created_));
  if (!created) {
    return {Code::kRefused, "a live receiver is already registered as '" + rec.name +
                                "' on the platform (give this one another --platform-name)"};
  }
  r->lease_ = std::move(lease);
  r->registered_.store(true);
  *out = std::move(r);
  return Status::ok();
}

Registration::~Registration() { lease_.reset(); }

void Registration::abandon() { lease_->abandon(); }

ReceiverRecord Registration::measured() {
  ReceiverRecord rec = options_.record;
  if (options_.measure) options_.measure(&rec);
  rec.updated_ms = wall_ms();
  return rec;
}

Status Registration::write(int64_t lease) {
  std::lock_guard lock(mutex_);
  if (lost_.load()) return Status::ok();
  const ReceiverRecord rec = measured();
  const std::string key = receiver_key(rec.name), value = encode(rec);
  // Ours still: refreshed (under the lease we hold now, which may be a new one).
  bool ours = false;
  SLOTSTREAM_RETURN_IF_ERROR(etcd_->txn({{key, "", Compare::Target::kCreate, Compare::Result::kEqual, created_}},
                                        {{Op::Kind::kPut, key, value, lease}}, &ours));
  if (ours) return Status::ok();
  // Gone with an expired lease: ours again, unless someone registered the name meanwhile.
  bool created = false;
  int64_t revision = 0;
  SLOTSTREAM_RETURN_IF_ERROR(create_record(*etcd_, key, value, lease, &created, &revision));
  if (created) {
    created_ = revision;
    if (options_.on_event) options_.on_event("registered again as " + rec.name + " (" + rec.address + ")");
    return Status::ok();
  }
  std::optional<KeyValue> now;
  SLOTSTREAM_RETURN_IF_ERROR(etcd_->get(key, &now));
  if (!now) return Status::ok();  // gone again meanwhile: the next tick creates it
  ReceiverRecord other;
  const std::string where = decode(now->value, &other).is_ok() ? " at " + other.address : "";
  lost_.store(true);
  if (options_.on_lost) {
    options_.on_lost("another receiver registered as '" + rec.name + "'" + where +
                     " while this one could not renew its platform lease (it was stopped, or cut off from etcd, for "
                     "longer than --platform-ttl): the name is that receiver's now, and this one leaves the platform");
  }
  return Status::ok();
}

}  // namespace slotstream::platform
