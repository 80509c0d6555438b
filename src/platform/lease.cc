#include "platform/lease.h"

namespace slotstream::platform {

using Clock = std::chrono::steady_clock;

Status KeptLease::start(Options options, std::unique_ptr<KeptLease>* out) {
  if (options.ttl_seconds < 1) return {Code::kInvalidArgument, "a lease TTL must be at least 1 s"};
  std::unique_ptr<KeptLease> l(new KeptLease(std::move(options)));
  SLOTSTREAM_RETURN_IF_ERROR(EtcdClient::create(l->options_.etcd, &l->etcd_));
  int64_t id = 0;
  SLOTSTREAM_RETURN_IF_ERROR(l->etcd_->lease_grant(l->options_.ttl_seconds, &id));
  l->id_.store(id, std::memory_order_release);
  l->thread_ = std::thread([p = l.get()] { p->run(); });
  *out = std::move(l);
  return Status::ok();
}

KeptLease::~KeptLease() {
  stop_thread();
  if (!abandoned_) (void)etcd_->lease_revoke(id());
}

void KeptLease::abandon() {
  {
    std::lock_guard lock(mutex_);
    abandoned_ = true;
  }
  stop_thread();
}

void KeptLease::stop_thread() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

// One keep-alive; a lease found gone is granted anew and handed to `regained`.
void KeptLease::keep_alive() {
  int64_t ttl = 0;
  Status st = etcd_->lease_keepalive(id(), &ttl);
  if (!st.is_ok()) {  // etcd out of reach: the lease may still outlive this; try again soon
    if (options_.on_event) options_.on_event("cannot renew the platform lease: " + st.message());
    return;
  }
  if (ttl > 0) return;
  int64_t fresh = 0;
  if (Status g = etcd_->lease_grant(options_.ttl_seconds, &fresh); !g.is_ok()) {
    if (options_.on_event) options_.on_event("the platform lease expired and cannot be renewed: " + g.message());
    return;
  }
  id_.store(fresh, std::memory_order_release);
  if (options_.on_event) {
    options_.on_event(
        "the platform lease had expired (etcd out of reach, or this process stopped, for longer than "
        "its TTL); granted a new one");
  }
  if (options_.regained) options_.regained(fresh);
}

void KeptLease::run() {
  const auto keep_every = std::chrono::milliseconds(options_.ttl_seconds * 1000 / 3);
  auto next_keep = Clock::now() + keep_every;
  auto next_tick = Clock::now() + options_.tick_every;
  std::unique_lock lock(mutex_);
  while (!stop_) {
    wake_.wait_until(lock, std::min(next_keep, next_tick), [this] { return stop_; });
    if (stop_) break;
    lock.unlock();
    const auto now = Clock::now();
    if (now >= next_keep) {
      keep_alive();
      next_keep = now + keep_every;
    }
    if (now >= next_tick) {
      if (options_.tick) options_.tick(id());
      next_tick = now + options_.tick_every;
    }
    lock.lock();
  }
}

}  // namespace slotstream::platform
