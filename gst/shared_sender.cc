#include "shared_sender.h"

#include <cstring>
#include <vector>

namespace slotstream::gst {

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kFinishKey = -1;  // the deadline of finish() among the devices' (device numbers are >= 0)
constexpr std::chrono::milliseconds kStopFinishLimit{5000};

// The connections of this process, by sender-name. A connection lives while a sink holds it.
std::mutex registry_mutex;
std::map<std::string, std::weak_ptr<SharedSender>>& registry() {
  static std::map<std::string, std::weak_ptr<SharedSender>> connections;
  return connections;
}

std::string address(const ConnectionSpec& s) { return s.host + ":" + std::to_string(s.port); }

}  // namespace

std::string ConnectionSpec::difference(const ConnectionSpec& other) const {
  const SenderOptions &a = *this, &b = other;
  if (a.host != b.host || a.port != b.port) return "to (" + address(*this) + " vs " + address(other) + ")";
  if (a.transport != b.transport) {
    return std::string("transport (") + transport_name(a.transport) + " vs " + transport_name(b.transport) + ")";
  }
  if (a.rdma.transport != b.rdma.transport) {
    auto name = [](const RdmaOptions& r) { return r.transport ? rdma_transport_name(*r.transport) : "unset"; };
    return std::string("rdma-transport (") + name(a.rdma) + " vs " + name(b.rdma) + ")";
  }
  if (a.rdma.device != b.rdma.device) return "rdma-device (" + a.rdma.device + " vs " + b.rdma.device + ")";
  if (a.protocol != b.protocol) return "protocol (" + a.protocol + " vs " + b.protocol + ")";
  auto number = [](const char* what, uint64_t x, uint64_t y) {
    return std::string(what) + " (" + std::to_string(x) + " vs " + std::to_string(y) + ")";
  };
  if (a.blocks != b.blocks) return number("blocks", a.blocks, b.blocks);
  if (a.block_size != b.block_size) return number("block-size", a.block_size, b.block_size);
  if (a.datagram.segment_size != b.datagram.segment_size) {
    return number("segment-size", a.datagram.segment_size, b.datagram.segment_size);
  }
  if (a.datagram.max_message != b.datagram.max_message) {
    return number("max-message", a.datagram.max_message, b.datagram.max_message);
  }
  if (a.token != b.token) return "token-file (the tokens differ)";
  return "";
}

Status SharedSender::attach(const ConnectionSpec& spec, uint16_t device, std::shared_ptr<SharedSender>* out) {
  std::lock_guard reg(registry_mutex);
  std::shared_ptr<SharedSender> s = registry()[spec.name].lock();
  if (!s) {
    s.reset(new SharedSender(spec));
    s->watchdog_ = std::thread([p = s.get()] { p->watch(); });
    registry()[spec.name] = s;
  }
  std::lock_guard lock(s->mutex_);
  const std::string who = "sender-name '" + spec.name + "'";
  if (std::string d = spec.difference(s->spec_); !d.empty()) {
    return {Code::kInvalidArgument, "another slotstreamsink of " + who + " has a different " + d +
                                        ": every sink of one sender-name shares its connection and its settings"};
  }
  if (s->attached_.contains(device)) {
    return {Code::kInvalidArgument, "device " + std::to_string(device) + " of " + who +
                                        " is already sent by another slotstreamsink: give each sink its own device"};
  }
  if (s->sender_ || !s->connect_error_.is_ok()) {
    return {Code::kInvalidArgument, who +
                                        " is already connected and carrying data: a device cannot join it; start "
                                        "every slotstreamsink of one sender-name before data flows (one pipeline "
                                        "does), or give this one another sender-name"};
  }
  s->attached_.insert(device);
  s->open_.insert(device);
  *out = std::move(s);
  return Status::ok();
}

SharedSender::~SharedSender() {
  {
    std::lock_guard lock(watch_mutex_);
    stop_watch_ = true;
  }
  watch_cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  // A sender never finished (every sink stopped with an error) is closed by its destructor: the receiver
  // keeps what it stored and discards a message half sent.
}

Status SharedSender::connect_locked() {
  SenderOptions o = spec_;  // the options, without the spec's own
  o.devices.assign(attached_.begin(), attached_.end());
  std::unique_ptr<Sender> sender;
  if (Status st = Sender::connect(o, &sender); !st.is_ok()) {
    // Each sink's error names the sender-name, the device and the receiver (slotstream_sink.cc): not again here.
    connect_error_ = {st.code(), "connecting: " + st.message()};
    return connect_error_;
  }
  std::lock_guard lock(watch_mutex_);  // interrupt() and the watchdog read sender_ under this lock
  sender_ = std::move(sender);
  return Status::ok();
}

Status SharedSender::send(uint16_t device, uint64_t length, const DeviceStream::FillFn& fill,
                          std::chrono::milliseconds max_wait) {
  DeviceStream* stream = nullptr;
  {
    std::lock_guard lock(mutex_);
    if (!connect_error_.is_ok()) return connect_error_;
    if (finished_) return {Code::kCancelled, "sender-name '" + spec_.name + "' has finished: every device ended"};
    if (!sender_) SLOTSTREAM_RETURN_IF_ERROR(connect_locked());
    stream = sender_->device(device);
  }
  if (!stream) return {Code::kInvalidArgument, "device " + std::to_string(device) + " is not attached"};
  arm(device, max_wait, "for room at the receiver");
  Status st = stream->send_with(length, fill);
  disarm(device);
  return st;
}

Status SharedSender::send(uint16_t device, std::span<const std::byte> message, std::chrono::milliseconds max_wait) {
  return send(
      device, message.size(),
      [&](uint64_t offset, std::span<std::byte> dst) {
        std::memcpy(dst.data(), message.data() + offset, dst.size());
        return Status::ok();
      },
      max_wait);
}

Status SharedSender::end_device(uint16_t device, std::chrono::milliseconds max_wait) {
  std::unique_lock lock(mutex_);
  open_.erase(device);
  return finish_if_done(lock, max_wait);
}

Status SharedSender::detach(uint16_t device, std::chrono::milliseconds max_wait) {
  std::unique_lock lock(mutex_);
  attached_.erase(device);
  if (!open_.erase(device)) return Status::ok();  // ended before: its end-of-stream finished what it had to
  return finish_if_done(lock, max_wait.count() > 0 ? max_wait : kStopFinishLimit);
}

Status SharedSender::finish_if_done(std::unique_lock<std::mutex>& /*held*/, std::chrono::milliseconds limit) {
  if (!open_.empty() || !sender_ || finished_) return Status::ok();
  finished_ = true;
  // Other sinks wait on mutex_ meanwhile; all of them have ended their devices, so none is sending.
  arm(kFinishKey, limit, "for the receiver to store the last messages");
  Status st = sender_->finish();
  disarm(kFinishKey);
  if (!st.is_ok()) return {st.code(), "finishing sender-name '" + spec_.name + "': " + st.message()};
  return Status::ok();
}

bool SharedSender::interrupt(uint16_t device) {
  std::lock_guard lock(watch_mutex_);
  if (!deadlines_.contains(device) || !sender_) return false;
  sender_->abort({Code::kCancelled, "slotstreamsink of device " + std::to_string(device) +
                                        " was stopped while it waited for the receiver"});
  return true;
}

void SharedSender::arm(int key, std::chrono::milliseconds limit, const char* what) {
  const auto at = limit.count() > 0 ? Clock::now() + limit : Clock::time_point::max();
  {
    std::lock_guard lock(watch_mutex_);
    deadlines_[key] = {at, limit, what};
  }
  if (limit.count() > 0) watch_cv_.notify_one();
}

void SharedSender::disarm(int key) {
  std::lock_guard lock(watch_mutex_);
  deadlines_.erase(key);
}

void SharedSender::watch() {
  std::unique_lock lock(watch_mutex_);
  while (!stop_watch_) {
    auto first = deadlines_.end();
    for (auto it = deadlines_.begin(); it != deadlines_.end(); ++it) {
      if (first == deadlines_.end() || it->second.at < first->second.at) first = it;
    }
    if (first == deadlines_.end() || first->second.at == Clock::time_point::max()) {
      watch_cv_.wait(lock);
      continue;
    }
    if (const Clock::time_point at = first->second.at; Clock::now() < at) {
      watch_cv_.wait_until(lock, at);  // a copy: the entry may be erased while this waits
      continue;
    }
    const std::string who =
        first->first == kFinishKey ? "sender-name '" + spec_.name + "'" : "device " + std::to_string(first->first);
    Status why{Code::kTimeout, who + " waited " + std::to_string(first->second.limit.count()) + " ms (max-wait) " +
                                   first->second.what + " at " + address(spec_) +
                                   ": the receiver is not taking data (stalled or paused, or nothing there consumes "
                                   "this device)"};
    deadlines_.erase(first);
    if (sender_) sender_->abort(std::move(why));  // wakes every waiting send; each returns this error
  }
}

}  // namespace slotstream::gst
