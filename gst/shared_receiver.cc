#include "shared_receiver.h"

#include <algorithm>
#include <set>

namespace slotstream::gst {

namespace {

std::mutex registry_mutex;
std::map<std::string, std::weak_ptr<ReceiverHub>>& registry() {
  static std::map<std::string, std::weak_ptr<ReceiverHub>> hubs;
  return hubs;
}

std::mutex log_mutex;
std::function<void(const std::string&)>& log_function() {
  static std::function<void(const std::string&)> f;
  return f;
}

std::string describe(const std::string& sender, uint16_t device) {
  return "device " + std::to_string(device) + " of " + (sender.empty() ? "any sender" : "sender '" + sender + "'");
}

}  // namespace

// ------------------------------------------------------------------------------------- Outlet

Outlet::Outlet(std::string sender, uint16_t device, size_t capacity, PayloadFactory factory)
    : wanted_(std::move(sender)),
      device_(device),
      capacity_(std::max<size_t>(capacity, 1)),
      factory_(std::move(factory)) {
  bound_ = wanted_;
}

Status Outlet::pop(Delivery* out) {
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return flushing_ || !queue_.empty(); });
  if (flushing_) return {Code::kCancelled, "flushing"};
  *out = std::move(queue_.front());
  queue_.pop_front();
  if (out->kind == Delivery::Kind::kBuffer) --buffers_;
  return Status::ok();
}

void Outlet::set_flushing(bool flushing) {
  std::lock_guard lock(mutex_);
  flushing_ = flushing;
  cv_.notify_all();
}

bool Outlet::has_room() {
  std::lock_guard lock(mutex_);
  return buffers_ < capacity_;
}

void Outlet::push(Delivery d) {
  std::lock_guard lock(mutex_);
  if (d.kind == Delivery::Kind::kBuffer) ++buffers_;
  queue_.push_back(std::move(d));
  cv_.notify_all();
}

// --------------------------------------------------------------------------------- RouterSink

// One sender's sink on the shared receiver: reassembles each device's messages into deliveries for the
// outlet of that device. Called from the sender's session thread only (MessageSink's contract).
class RouterSink : public MessageSink {
 public:
  RouterSink(ReceiverHub& hub, const SenderInfo& info)
      : hub_(hub),
        sender_(info.name),
        streaming_(info.devices.begin(), info.devices.end()) {}

  Status begin(uint16_t device) override {
    std::shared_ptr<Outlet> outlet = hub_.route(sender_, device);
    if (!outlet) {
      if (unclaimed_.insert(device).second) {
        ReceiverHub::log("no slotstreamsrc at " + hub_.address() + " takes " + describe(sender_, device) +
                         "; its messages wait (the sender is paused) until one does");
      }
      return {Code::kBusy, "no slotstreamsrc for this device"};
    }
    unclaimed_.erase(device);
    if (!outlet->has_room()) return {Code::kBusy, "the slotstreamsrc's queue is full"};  // back-pressure
    Open& o = open_[device];
    o = Open{};
    o.outlet = std::move(outlet);
    return Status::ok();
  }

  Status append(uint16_t device, std::span<const std::byte> data) override {
    auto it = open_.find(device);
    if (it == open_.end() || it->second.broken) return Status::ok();  // the rest of a refused message
    Open& o = it->second;
    Status st = o.assembler.feed(data, [&](uint64_t length) {
      o.payload = o.outlet->factory_(length);
      return o.payload ? o.payload->bytes() : std::span<std::byte>{};
    });
    if (!st.is_ok()) fail(o, device, st);
    return Status::ok();
  }

  Status commit(uint16_t device) override {
    auto it = open_.find(device);
    if (it == open_.end()) return Status::ok();
    Open& o = it->second;
    Frame frame;
    if (!o.broken) {
      if (Status st = o.assembler.finish(&frame); !st.is_ok()) {
        fail(o, device, st);
      } else {
        Delivery d;
        d.kind = frame.kind == FrameKind::kCaps     ? Delivery::Kind::kCaps
                 : frame.kind == FrameKind::kBuffer ? Delivery::Kind::kBuffer
                                                    : Delivery::Kind::kEos;
        d.caps = std::move(frame.caps);
        d.buffer = frame.buffer;
        d.payload = std::move(o.payload);
        d.sender = sender_;
        if (d.kind == Delivery::Kind::kEos) {
          hub_.mark_ended(*o.outlet);
          // Every device ended: the sender finishes next (FIN), which a receiver stopping now would cut short.
          if (streaming_.erase(device) && streaming_.empty()) hub_.session_closing(sender_);
        }
        o.outlet->push(std::move(d));
      }
    }
    open_.erase(it);
    return Status::ok();
  }

  void abort(uint16_t device) override { open_.erase(device); }

 private:
  struct Open {
    std::shared_ptr<Outlet> outlet;
    Assembler assembler;
    std::unique_ptr<Payload> payload;
    bool broken = false;
  };

  // A message that is not a slotstreamsink frame ends that src's stream with an error; the sender's other
  // devices go on. The message is consumed, not retried: retrying cannot make it valid.
  void fail(Open& o, uint16_t device, const Status& st) {
    o.broken = true;
    Delivery d;
    d.kind = Delivery::Kind::kError;
    d.error = {st.code(), describe(sender_, device) + ": " + st.message()};
    d.sender = sender_;
    hub_.mark_ended(*o.outlet);
    o.outlet->push(std::move(d));
  }

  ReceiverHub& hub_;
  const std::string sender_;
  std::map<uint16_t, Open> open_;
  std::set<uint16_t> unclaimed_;  // devices already reported as unclaimed
  std::set<uint16_t> streaming_;  // declared devices whose end-of-stream message has not come
};

// -------------------------------------------------------------------------------- ReceiverHub

Status ReceiverHub::attach(const std::string& listen, const std::string& token, std::shared_ptr<Outlet> outlet,
                           std::shared_ptr<ReceiverHub>* out) {
  std::lock_guard reg(registry_mutex);
  std::shared_ptr<ReceiverHub> hub = registry()[listen].lock();
  if (!hub) {
    hub.reset(new ReceiverHub(listen, token));
    SLOTSTREAM_RETURN_IF_ERROR(hub->start());
    registry()[listen] = hub;
  } else if (hub->token_ != token) {
    return {Code::kInvalidArgument, "another slotstreamsrc listens on " + listen +
                                        " with a different token-file: the srcs of one address share its receiver"};
  }
  std::lock_guard lock(hub->mutex_);
  for (const auto& o : hub->outlets_) {
    if (o->device_ == outlet->device_ && o->wanted_ == outlet->wanted_) {
      return {Code::kInvalidArgument,
              "another slotstreamsrc on " + listen + " already takes " + describe(outlet->wanted_, outlet->device_)};
    }
  }
  hub->outlets_.push_back(std::move(outlet));
  *out = std::move(hub);
  return Status::ok();
}

Status ReceiverHub::start() {
  ReceiverOptions o;
  if (Status st = parse_address(listen_, &o.host, &o.port); !st.is_ok()) return {st.code(), "listen: " + st.message()};
  o.token = token_;
  o.make_sink = [this](const SenderInfo& info, std::unique_ptr<MessageSink>* sink) {
    *sink = std::make_unique<RouterSink>(*this, info);
    return Status::ok();
  };
  o.on_session_end = [this](const SessionReport& r) { session_ended(r); };
  o.on_event = [](const std::string& text) { log(text); };
  if (Status st = Receiver::start(std::move(o), &receiver_); !st.is_ok()) {
    return {st.code(), "listening on " + listen_ + ": " + st.message()};
  }
  return Status::ok();
}

ReceiverHub::~ReceiverHub() {
  {
    // The last src stops, typically because its stream ended: senders whose every device ended are finishing
    // their connection now; let them (they would report the receiver gone otherwise), within a bound.
    std::unique_lock lock(mutex_);
    closing_cv_.wait_for(lock, kClosingGrace, [&] { return closing_.empty(); });
  }
  if (receiver_) receiver_->stop();  // ends every session; no callback runs after this
}

void ReceiverHub::session_closing(const std::string& sender) {
  std::lock_guard lock(mutex_);
  closing_.insert(sender);
}

void ReceiverHub::detach(const std::shared_ptr<Outlet>& outlet) {
  std::lock_guard lock(mutex_);
  std::erase(outlets_, outlet);
}

std::string ReceiverHub::address() const { return receiver_->listen_address(); }

std::shared_ptr<Outlet> ReceiverHub::route(const std::string& sender, uint16_t device) {
  std::lock_guard lock(mutex_);
  std::shared_ptr<Outlet> any;
  for (const auto& o : outlets_) {
    if (o->device_ != device || o->ended_) continue;
    if (o->bound_ == sender) return o;
    if (!any && o->bound_.empty()) any = o;
  }
  if (any) any->bound_ = sender;
  return any;
}

void ReceiverHub::mark_ended(Outlet& outlet) {
  std::lock_guard lock(mutex_);
  outlet.ended_ = true;
}

// A sender's connection ended: the srcs it fed end too — cleanly (end of stream) when it finished, with an
// error when it was lost. A src whose stream already ended (its end-of-stream message) is left alone.
void ReceiverHub::session_ended(const SessionReport& r) {
  std::lock_guard lock(mutex_);
  if (closing_.erase(r.sender.name)) closing_cv_.notify_all();
  for (const auto& o : outlets_) {
    if (o->ended_ || o->bound_ != r.sender.name) continue;
    if (std::find(r.sender.devices.begin(), r.sender.devices.end(), o->device_) == r.sender.devices.end()) continue;
    Delivery d;
    d.sender = r.sender.name;
    if (!r.finished) {
      d.kind = Delivery::Kind::kError;
      d.error = {Code::kPeerGone,
                 describe(r.sender.name, o->device_) + ": the sender was lost mid-stream (" + r.reason + ")"};
    }
    o->ended_ = true;
    o->push(std::move(d));
  }
}

void ReceiverHub::set_log(std::function<void(const std::string&)> log) {
  std::lock_guard lock(log_mutex);
  log_function() = std::move(log);
}

void ReceiverHub::log(const std::string& text) {
  std::lock_guard lock(log_mutex);
  if (log_function()) log_function()(text);
}

}  // namespace slotstream::gst
