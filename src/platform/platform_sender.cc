// PlatformSender (include/slotstream/platform.h): a Sender whose receiver the platform chooses,
// and which outlives its receiver. Every message is kept (ReplayLog) until the receiver confirms
// it stored (STORED); when the receiver dies, the first send() or finish() that fails takes the
// gate exclusively, asks the platform for another receiver (the lost one excluded), connects with
// each device numbered from its first unconfirmed message, and sends those again — so the numbers
// on disk continue, and what the dead receiver stored without confirming is recognised there as
// stored already (at-least-once on the wire, each number once in a directory).
//
// PlatformSender::Impl and its timing are in platform_sender_impl.h; moving devices (set_devices) is in
// platform_sender_moves.cc.
#include "platform/platform_sender_impl.h"

namespace slotstream {

std::vector<uint16_t> PlatformSender::Impl::declared() const {
  std::set<uint16_t> all(devices.begin(), devices.end());
  all.insert(options.movable.begin(), options.movable.end());
  return {all.begin(), all.end()};
}

// Exclusive gate held (or before any send).
void PlatformSender::Impl::set_routed(const std::vector<uint16_t>& set) {
  for (auto& [d, dev] : streams) {
    std::lock_guard lock(dev->mutex);
    dev->routed = std::find(set.begin(), set.end(), d) != set.end();
  }
}

// A send() that would keep more than replay_limit bytes waits for the receiver's confirmations.
// Shared gate held.
Status PlatformSender::Impl::wait_for_room(uint16_t d, Device& dev, size_t bytes,
                                           std::optional<Clock::time_point> deadline) {
  for (;;) {
    {
      std::lock_guard lock(dev.mutex);
      trim(d, dev);
      if (dev.log.bytes() == 0 || dev.log.bytes() + bytes <= options.replay_limit) return Status::ok();
    }
    SLOTSTREAM_RETURN_IF_ERROR(abort_status());
    if (deadline && Clock::now() >= *deadline) {
      return {Code::kTimeout,
              "the receiver has not confirmed enough of device " + std::to_string(d) + "'s messages (replay_limit)"};
    }
    std::this_thread::sleep_for(kRoomPoll);
  }
}

// Connects to the placement's receiver with every device numbered from its first unconfirmed
// message (when the numbers are known: they are from the first connection's handshake on; before
// it, the receiver continues after its own disk). Exclusive gate held.
Status PlatformSender::Impl::connect_to(const platform::Placement& p) {
  SenderOptions so = options.sender;
  SLOTSTREAM_RETURN_IF_ERROR(net::parse_host_port(p.address, &so.host, &so.port));
  so.devices = declared();
  so.confirm_stored = true;
  so.first_message.clear();
  bool numbered = true;
  for (uint16_t d : devices) numbered = numbered && streams.at(d)->log.base().has_value();
  for (uint16_t d : so.devices) {
    auto& dev = streams[d];
    if (!dev) dev = std::make_unique<Device>();
    if (!dev->routed) {
      // Declared for a later move in place, which says its number first (NUMBER).
      if (numbered) so.first_message[d] = dev->log.first_unconfirmed_number().value_or(0);
      continue;
    }
    if (numbered) {
      so.first_message[d] = *dev->log.first_unconfirmed_number();
    } else {
      dev->log.forget_base();  // learnt again from this receiver's first STORED
    }
    dev->begin = dev->log.confirmed();
  }
  std::unique_ptr<Sender> s;
  SLOTSTREAM_RETURN_IF_ERROR(Sender::connect(so, &s));
  set_sender(std::move(s), &p);
  receiver = p.receiver;
  ++generation;
  // The receiver said where its numbers start during the handshake (its first STORED): learnt now,
  // so that a receiver dying before any later confirmation still leaves the numbers known.
  for (uint16_t d : devices) {
    Device& dev = *streams.at(d);
    std::lock_guard lock(dev.mutex);
    trim(d, dev);
  }
  return Status::ok();
}

// Sends again, in order, every message not yet confirmed. Exclusive gate held.
Status PlatformSender::Impl::replay() {
  uint64_t resent = 0;
  for (uint16_t d : devices) {
    Device& dev = *streams.at(d);
    std::lock_guard lock(dev.mutex);
    for (const auto& m : dev.log.pending()) {
      SLOTSTREAM_RETURN_IF_ERROR(sender->device(d)->send(m));
      ++resent;
    }
  }
  std::lock_guard lock(stats_mutex);
  stats.resent += resent;
  return Status::ok();
}

// Asks the platform for a receiver and connects, until one works or patience runs out.
// Exclusive gate held.
Status PlatformSender::Impl::schedule(std::set<std::string> exclude, bool keep_asking) {
  const auto deadline = Clock::now() + options.patience;
  platform::Request req;
  req.amount = {options.need.cpu, options.need.bandwidth, options.need.fps,
                receive_memory(options.sender, devices.size())};
  req.devices = devices;
  if (options.sender.transport != Transport::kAuto) req.transport = transport_name(options.sender.transport);
  Status last;
  for (;;) {
    SLOTSTREAM_RETURN_IF_ERROR(abort_status());
    const auto t0 = Clock::now();
    req.exclude = exclude;
    platform::Placement p;
    last = lease->reserve(req, &p);
    const auto reserved = Clock::now();
    if (last.is_ok()) {
      last = connect_to(p);
      if (last.is_ok()) last = replay();
      if (last.is_ok()) {
        const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        {
          std::lock_guard lock(stats_mutex);
          stats.schedule_ms.push_back(ms);
          ++stats.connections;
          stats.receiver = receiver;
          stats.transport = transport_name(sender->transport());
          stats.transport_reason = sender->transport_reason();
        }
        char line[128];
        std::snprintf(line, sizeof line, " (scheduled and connected in %.1f ms: reserved in %.1f, %d transaction%s)",
                      ms, std::chrono::duration<double, std::milli>(reserved - t0).count(), p.attempts,
                      p.attempts == 1 ? "" : "s");
        event("using receiver " + p.why + line);
        return Status::ok();
      }
      set_sender(nullptr);
      // The receiver still holds our name while its session of our last connection ends: the
      // same receiver again, shortly. Anything else: another receiver.
      if (last.message().find("already connected") == std::string::npos) exclude.insert(p.receiver);
      event("receiver " + p.receiver + " at " + p.address + " did not take the stream: " + last.message());
    } else if ((last.code() == Code::kRefused && !keep_asking) || last.code() == Code::kAuthFailed ||
               last.code() == Code::kInvalidArgument) {
      break;  // asking again changes nothing: etcd refused who we are, or what we ask is wrong
    }
    if (Clock::now() + kRetryPause > deadline) break;
    std::this_thread::sleep_for(kRetryPause);
  }
  const Code code =
      last.code() == Code::kRefused || last.code() == Code::kAuthFailed || last.code() == Code::kInvalidArgument
          ? last.code()
          : Code::kConnectFailed;
  return {code, "no receiver from the platform: " + last.message()};
}

// The receiver is gone (or the connection failed): schedule another and send again what it did
// not confirm. Exclusive gate held.
Status PlatformSender::Impl::recover_locked(const Status& cause) {
  const std::string lost = receiver;
  for (auto& [d, dev] : streams) {
    std::lock_guard lock(dev->mutex);
    if (dev->routed) trim(d, *dev);  // the last confirmations the dead connection received
  }
  set_sender(nullptr);
  receiver.clear();
  {
    std::lock_guard lock(stats_mutex);
    ++stats.reschedules;
    stats.receiver.clear();
  }
  event("lost receiver " + lost + " (" + cause.message() + "); asking the platform for another");
  Status st = schedule({lost}, /*keep_asking=*/true);
  if (!st.is_ok()) fatal = st;
  return st;
}

Status PlatformSender::Impl::recover(uint64_t gen, const Status& cause) {
  std::unique_lock lock(gate);
  if (!fatal.is_ok()) return fatal;
  SLOTSTREAM_RETURN_IF_ERROR(abort_status());
  if (generation != gen && sender) return Status::ok();  // another thread moved the stream already
  return recover_locked(cause);
}

// FIN on the current connection until it succeeds (moving as often as receivers die); then every
// message is stored. Exclusive gate held.
Status PlatformSender::Impl::finish_locked() {
  while (sender) {
    Status st = sender->finish();
    if (st.is_ok()) {
      for (auto& [d, dev] : streams) {
        std::lock_guard lock(dev->mutex);
        if (!dev->routed) continue;  // a declared device not sent now has nothing pending
        trim(d, *dev);               // learns the numbers if nothing else did
        dev->log.confirm(dev->begin, dev->log.next() - dev->begin);  // FIN_ACK: all stored
      }
      set_sender(nullptr);
      return Status::ok();
    }
    if (st.code() == Code::kInvalidArgument) return st;
    SLOTSTREAM_RETURN_IF_ERROR(abort_status());
    SLOTSTREAM_RETURN_IF_ERROR(recover_locked(st));
  }
  return Status::ok();
}

Status PlatformSender::Impl::send_owned(uint16_t d, std::vector<std::byte> message,
                                        std::optional<Clock::time_point> deadline) {
  uint64_t gen = 0;
  Status st;
  {
    std::shared_lock lock(gate);
    if (!fatal.is_ok()) return fatal;
    SLOTSTREAM_RETURN_IF_ERROR(abort_status());
    Device* dev = stream(d);
    if (!dev || !sender || !sender->device(d)) {
      return {Code::kInvalidArgument, "device " + std::to_string(d) + " is not sent through the platform now"};
    }
    SLOTSTREAM_RETURN_IF_ERROR(wait_for_room(d, *dev, message.size(), deadline));
    std::lock_guard dl(dev->mutex);
    if (!dev->routed) {
      return {Code::kInvalidArgument, "device " + std::to_string(d) + " is not sent through the platform now"};
    }
    dev->log.append(std::move(message));
    st = send_logged(d, *dev, deadline);
    if (st.code() == Code::kTimeout) return st;  // not taken
    gen = generation;
  }
  if (st.is_ok() || st.code() == Code::kInvalidArgument) return st;
  SLOTSTREAM_RETURN_IF_ERROR(abort_status());
  // The message is in the log: the move sends it again with the others.
  return recover(gen, st);
}

// Sends the log's newest message. Given up (kTimeout) before its first fragment went, it leaves the
// log again; once begun it is sent in full. Shared gate and dev.mutex held.
Status PlatformSender::Impl::send_logged(uint16_t d, Device& dev, std::optional<Clock::time_point> deadline) {
  // A reference into the log stays valid: only this device's thread or an exclusive mover trims it.
  const std::vector<std::byte>& m = dev.log.pending().back();
  if (!deadline) return sender->device(d)->send(m);
  DeviceStream::Progress progress;
  Status st = sender->device(d)->send(m, *deadline, &progress);
  if (st.code() == Code::kTimeout && progress.next_fragment == 0) {
    dev.log.drop_newest();
    return {Code::kTimeout, "no send block came free for device " + std::to_string(d) + " (the receiver is slow)"};
  }
  while (st.code() == Code::kTimeout) st = sender->device(d)->send(m, Clock::now() + kRoomPoll * 50, &progress);
  return st;
}

void PlatformSender::Impl::watch() {
  std::unique_lock lock(watch_mutex);
  while (!watch_wake.wait_for(lock, kWatchEvery, [this] { return watch_stop; })) {
    lock.unlock();
    check_receiver();
    lock.lock();
  }
}

void PlatformSender::Impl::check_receiver() {
  platform::Placement p;
  {
    std::lock_guard lock(sender_mutex);
    if (!sender || watched.receiver.empty()) return;
    p = watched;
  }
  std::optional<platform::KeyValue> kv;
  // etcd out of reach says nothing about the receiver: the stream goes on (the data path does not
  // touch etcd).
  if (!watch_etcd->get(platform::receiver_key(p.receiver), &kv).is_ok()) return;
  if (kv && kv->create_revision == p.registered_revision) return;
  platform::ReceiverRecord now;
  const bool same = kv && platform::decode(kv->value, &now).is_ok() && now.address == p.address;
  std::lock_guard lock(sender_mutex);
  if (!sender || watched.receiver != p.receiver || watched.registered_revision != p.registered_revision) return;
  if (same) {  // it registered again (its lease had lapsed): the same receiver, watched as it is now
    watched.registered_revision = kv->create_revision;
    return;
  }
  const auto silent = sender->receiver_silence();
  if (silent < kWatchSilence) return;  // it still answers: it will register again, or leave
  char why[256];
  std::snprintf(why, sizeof why,
                "lost the receiver (its platform record %s and it has said nothing for %.1f s: it is stopped or hung)",
                kv ? "is another receiver's now" : "went with its lease",
                std::chrono::duration<double>(silent).count());
  sender->abort({Code::kPeerGone, why});
  watched = {};
}

PlatformSender::PlatformSender(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

PlatformSender::~PlatformSender() {
  impl_->stop_watching();
  std::unique_lock lock(impl_->gate);
  impl_->set_sender(nullptr);
  impl_->lease.reset();  // revokes: the reservation goes at once
}

Status PlatformSender::connect(PlatformSenderOptions options, std::unique_ptr<PlatformSender>* out) {
  platform::EtcdConfig etcd;
  SLOTSTREAM_RETURN_IF_ERROR(platform::etcd_config(options.platform, options.security, &etcd));
  if (auto why = platform::invalid_amount({options.need.cpu, options.need.bandwidth, options.need.fps, 0})) {
    return {Code::kInvalidArgument, "the need to reserve: " + *why};
  }
  auto impl = std::make_unique<Impl>();
  Impl& im = *impl;
  im.options = std::move(options);
  im.devices = im.options.sender.devices;
  SLOTSTREAM_RETURN_IF_ERROR(platform::EtcdClient::create(etcd, &im.watch_etcd));
  SLOTSTREAM_RETURN_IF_ERROR(platform::SenderLease::start(etcd, im.options.sender.name, im.options.lease_ttl_seconds,
                                                          im.options.on_event, &im.lease));
  for (uint16_t d : im.devices) {
    im.streams[d] = std::make_unique<Impl::Device>();
    im.streams[d]->routed = true;
  }
  if (!im.devices.empty()) {
    std::unique_lock lock(im.gate);
    SLOTSTREAM_RETURN_IF_ERROR(im.schedule({}, /*keep_asking=*/false));
  }
  im.watcher = std::thread([p = &im] { p->watch(); });
  out->reset(new PlatformSender(std::move(impl)));
  return Status::ok();
}

Status PlatformSender::send(uint16_t device, std::span<const std::byte> message) {
  Status st = impl_->send_owned(device, std::vector<std::byte>(message.begin(), message.end()));
  if (st.is_ok()) {
    std::lock_guard lock(impl_->stats_mutex);
    ++impl_->stats.messages;
  }
  return st;
}

Status PlatformSender::send(uint16_t device, std::span<const std::byte> message, Clock::time_point deadline) {
  Status st = impl_->send_owned(device, std::vector<std::byte>(message.begin(), message.end()), deadline);
  if (st.is_ok()) {
    std::lock_guard lock(impl_->stats_mutex);
    ++impl_->stats.messages;
  }
  return st;
}

void PlatformSender::abort(Status why) {
  std::lock_guard lock(impl_->sender_mutex);
  if (impl_->aborted.is_ok()) impl_->aborted = why;
  if (impl_->sender) impl_->sender->abort(impl_->aborted);
}

Status PlatformSender::send_with(uint16_t device, uint64_t length, const DeviceStream::FillFn& fill) {
  std::vector<std::byte> message(length);
  SLOTSTREAM_RETURN_IF_ERROR(fill(0, message));
  Status st = impl_->send_owned(device, std::move(message));
  if (st.is_ok()) {
    std::lock_guard lock(impl_->stats_mutex);
    ++impl_->stats.messages;
  }
  return st;
}

Status PlatformSender::finish() {
  std::unique_lock lock(impl_->gate);
  if (!impl_->fatal.is_ok()) return impl_->fatal;
  SLOTSTREAM_RETURN_IF_ERROR(impl_->finish_locked());
  impl_->receiver.clear();
  return impl_->lease->release();
}
std::vector<uint16_t> PlatformSender::devices() const {
  std::lock_guard lock(impl_->devices_mutex);
  return impl_->devices;
}

PlatformSenderStats PlatformSender::stats() const {
  std::lock_guard lock(impl_->stats_mutex);
  return impl_->stats;
}

}  // namespace slotstream
