#include "platform/registration.h"

namespace slotstream::platform {

namespace {

int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

Status Registration::start(RegistrationOptions options, std::unique_ptr<Registration>* out) {
  if (auto why = invalid_platform_name(options.record.name)) {
    return {Code::kInvalidArgument, "receiver name '" + options.record.name + "': " + *why};
  }
  std::unique_ptr<Registration> r(new Registration(std::move(options)));
  SLOTSTREAM_RETURN_IF_ERROR(EtcdClient::create(r->options_.endpoints, &r->etcd_));
  KeptLease::Options lo;
  lo.endpoints = r->options_.endpoints;
  lo.ttl_seconds = r->options_.ttl_seconds;
  lo.tick_every = r->options_.refresh;
  lo.on_event = r->options_.on_event;
  Registration* self = r.get();
  lo.regained = [self](int64_t lease) {
    if (self->registered_.load()) (void)self->write(lease);
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
  ReceiverRecord rec = r->options_.record;
  if (r->options_.measure) r->options_.measure(&rec);
  rec.updated_ms = wall_ms();
  const std::string key = receiver_key(rec.name);
  bool created = false;
  SLOTSTREAM_RETURN_IF_ERROR(r->etcd_->txn({{key, "", Compare::Target::kVersion, Compare::Result::kEqual, 0}},
                                           {{Op::Kind::kPut, key, encode(rec), lease->id()}}, &created));
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

Status Registration::write(int64_t lease) {
  std::lock_guard lock(mutex_);
  ReceiverRecord rec = options_.record;
  if (options_.measure) options_.measure(&rec);
  rec.updated_ms = wall_ms();
  return etcd_->put(receiver_key(rec.name), encode(rec), lease);
}

}  // namespace slotstream::platform
