#include "shared_receiver.h"

#include <algorithm>
#include <cstring>
#include <limits>
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

Outlet::Outlet(std::string sender, uint16_t device, size_t capacity, PayloadFactory factory, ZeroCopy zero_copy)
    : wanted_(std::move(sender)),
      device_(device),
      capacity_(std::max<size_t>(capacity, 1)),
      factory_(std::move(factory)),
      zero_copy_(zero_copy) {
  bound_ = wanted_;
}

Status Outlet::pop(Delivery* out) {
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return flushing_ || !queue_.empty(); });
  if (flushing_) return {Code::kCancelled, "flushing"};
  *out = std::move(queue_.front());
  queue_.pop_front();
  if (out->kind == Delivery::Kind::kBuffer && buffers_-- == capacity_) room_cv_.notify_all();
  return Status::ok();
}

void Outlet::set_flushing(bool flushing) {
  std::lock_guard lock(mutex_);
  flushing_ = flushing;
  cv_.notify_all();
  room_cv_.notify_all();
}

bool Outlet::has_room(std::chrono::milliseconds wait) {
  std::unique_lock lock(mutex_);
  return room_cv_.wait_for(lock, wait, [&] { return buffers_ < capacity_ || flushing_; }) && !flushing_;
}

bool Outlet::first_from(const std::string& sender) {
  std::lock_guard lock(mutex_);
  if (noted_ == sender) return false;
  noted_ = sender;
  return true;
}

void Outlet::push(Delivery d) {
  std::lock_guard lock(mutex_);
  if (d.kind == Delivery::Kind::kBuffer) ++buffers_;
  queue_.push_back(std::move(d));
  cv_.notify_all();
}

// ------------------------------------------------------------------------------ SenderRoutes

// What both sinks of one sender share (RouterSink copies, ViewRouter lends): routing each device's messages to
// the outlet that takes them, its note, and the frames. Called from the sender's session thread only.
class SenderRoutes {
 public:
  // How long a message waits for room in its src's queue before its device pauses.
  static constexpr std::chrono::milliseconds kRoomWait{5};

  // copy_reason: why this sender's buffers cannot be lent ("" when they can).
  SenderRoutes(ReceiverHub& hub, const SenderInfo& info, std::string copy_reason)
      : hub_(hub),
        sender_(info.name),
        block_size_(info.block_size),
        copy_reason_(std::move(copy_reason)),
        streaming_(info.devices.begin(), info.devices.end()) {}

  // The outlet that takes `device`'s next message now; kBusy when none does or its queue is full (the device
  // pauses; nothing is lost). Ok with a null outlet: the message is to be consumed, its src ended with an error.
  Status claim(uint16_t device, std::shared_ptr<Outlet>* out) {
    std::shared_ptr<Outlet> outlet = hub_.route(sender_, device);
    if (!outlet) {
      if (unclaimed_.insert(device).second) {
        ReceiverHub::log("no slotstreamsrc at " + hub_.address() + " takes " + describe(sender_, device) +
                         "; its messages wait (the sender is paused) until one does");
      }
      return {Code::kBusy, "no slotstreamsrc for this device"};
    }
    unclaimed_.erase(device);
    // Back-pressure. A src pops its queue as fast as downstream takes buffers, typically within a
    // millisecond: a short wait spares the device a pause, which lasts Delivery::kBusyRetry (100 ms) —
    // with 4 buffers a pause, a src of fast frames would get about 40 a second (two srcs of 64x48 frames
    // at 1000/1 would make their sinks time out). Longer would hold up the sender's other devices.
    if (!outlet->has_room(kRoomWait)) return {Code::kBusy, "the slotstreamsrc's queue is full"};
    if (outlet->first_from(sender_)) {
      if (outlet->zero_copy() == ZeroCopy::kOn && !copy_reason_.empty()) {
        fail(*outlet, device, {Code::kRefused, "zero-copy=on, but " + copy_reason_ + " (zero-copy=auto accepts that)"});
        return Status::ok();
      }
      note(*outlet, outlet->zero_copy() != ZeroCopy::kOff && copy_reason_.empty(), initial_note(*outlet));
    }
    *out = std::move(outlet);
    return Status::ok();
  }

  // The once-per-stream note that lent buffers still arrive copied (a message that spanned blocks, or one
  // set aside while its device was paused: the receiver's one copy, handed on as it is).
  void note_copied(Outlet& outlet, uint16_t device, size_t message_size) {
    if (!copied_noted_.insert(device).second) return;
    const bool spans = message_size + kBlockHeaderSize > block_size_;
    note(outlet, false,
         spans ? "a message of " + std::to_string(message_size) + " bytes spans several receive blocks of " +
                     std::to_string(block_size_) +
                     " bytes: such buffers are copied once by the receiver (raise the slotstreamsink's block-size "
                     "for zero-copy)"
               : "a message set aside while its device was paused is copied once by the receiver");
  }

  // A decoded message to its outlet; end of stream ends the device.
  void deliver(Outlet& outlet, uint16_t device, Frame& frame, Delivery d) {
    d.kind = frame.kind == FrameKind::kCaps     ? Delivery::Kind::kCaps
             : frame.kind == FrameKind::kBuffer ? Delivery::Kind::kBuffer
                                                : Delivery::Kind::kEos;
    d.caps = std::move(frame.caps);
    d.buffer = frame.buffer;
    d.sender = sender_;
    if (d.kind == Delivery::Kind::kEos) {
      hub_.mark_ended(outlet);
      // Every device ended: the sender finishes next (FIN), which a receiver stopping now would cut short.
      if (streaming_.erase(device) && streaming_.empty()) hub_.session_closing(sender_);
    }
    outlet.push(std::move(d));
  }

  // A message that is not a slotstreamsink frame ends that src's stream with an error; the sender's other
  // devices go on. The message is consumed, not retried: retrying cannot make it valid.
  void fail(Outlet& outlet, uint16_t device, const Status& st) {
    Delivery d;
    d.kind = Delivery::Kind::kError;
    d.error = {st.code(), describe(sender_, device) + ": " + st.message()};
    d.sender = sender_;
    hub_.mark_ended(outlet);
    outlet.push(std::move(d));
  }

 private:
  // slotstream's block header before a message that starts a block (docs/design.md, the block layout).
  static constexpr size_t kBlockHeaderSize = 16;

  std::string initial_note(const Outlet& outlet) const {
    if (outlet.zero_copy() == ZeroCopy::kOff) return "zero-copy=off: buffers are copied once out of the receive blocks";
    if (!copy_reason_.empty()) return copy_reason_;
    return "buffers are the receive blocks themselves (zero-copy): each block stays held (status 2) until "
           "downstream frees its buffer";
  }

  void note(Outlet& outlet, bool zero_copy, std::string text) {
    Delivery d;
    d.kind = Delivery::Kind::kNote;
    d.zero_copy = zero_copy;
    d.note = std::move(text);
    d.sender = sender_;
    outlet.push(std::move(d));
  }

  ReceiverHub& hub_;
  const std::string sender_;
  const uint32_t block_size_;
  const std::string copy_reason_;
  std::set<uint16_t> unclaimed_;     // devices already reported as unclaimed
  std::set<uint16_t> streaming_;     // declared devices whose end-of-stream message has not come
  std::set<uint16_t> copied_noted_;  // devices already told that a lent buffer arrived copied
};

// --------------------------------------------------------------------------------- RouterSink

// The copy path for a sender whose protocol cannot lend blocks: reassembles each device's messages, copying
// each payload once into the outlet's memory. Called from the sender's session thread only (MessageSink).
class RouterSink : public MessageSink {
 public:
  RouterSink(ReceiverHub& hub, const SenderInfo& info)
      : routes_(hub, info,
                "sender '" + info.name + "' uses protocol " + info.protocol +
                    ", which cannot lend receive blocks (no status 2): buffers are copied once (protocol=status_byte "
                    "on its slotstreamsink for zero-copy)") {}

  Status begin(uint16_t device) override {
    std::shared_ptr<Outlet> outlet;
    SLOTSTREAM_RETURN_IF_ERROR(routes_.claim(device, &outlet));
    Open& o = open_[device];
    o = Open{};
    o.broken = !outlet;  // its src ended: the message is consumed
    o.outlet = std::move(outlet);
    return Status::ok();
  }

  Status append(uint16_t device, std::span<const std::byte> data) override {
    auto it = open_.find(device);
    if (it == open_.end() || it->second.broken) return Status::ok();  // the rest of a refused message
    Open& o = it->second;
    Status st = o.assembler.feed(data, [&](uint64_t length) {
      o.payload = o.outlet->allocate(length);
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
        d.payload = std::move(o.payload);
        routes_.deliver(*o.outlet, device, frame, std::move(d));
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

  void fail(Open& o, uint16_t device, const Status& st) {
    o.broken = true;
    routes_.fail(*o.outlet, device, st);
  }

  SenderRoutes routes_;
  std::map<uint16_t, Open> open_;
};

// --------------------------------------------------------------------------------- ViewRouter

// Zero-copy: each message comes whole, lent in place (MessageView). A buffer for a src that lends goes to it as
// the view (its block held until the src's buffer is freed); for a src with zero-copy off its payload is copied
// once and the view released at once. Called from the sender's session thread only (ViewSink).
class ViewRouter : public ViewSink {
 public:
  ViewRouter(ReceiverHub& hub, const SenderInfo& info) : routes_(hub, info, "") {}

  Status take(MessageView& view) override {
    const uint16_t device = view.device();
    std::shared_ptr<Outlet> outlet;
    SLOTSTREAM_RETURN_IF_ERROR(routes_.claim(device, &outlet));  // kBusy: the view stays, offered again later
    if (!outlet) return Status::ok();                            // consumed (released by the caller)
    Frame frame;
    std::span<const std::byte> payload;
    if (Status st = assembler_.decode_in_place(view.data(), &frame, &payload); !st.is_ok()) {
      routes_.fail(*outlet, device, st);
      return Status::ok();
    }
    Delivery d;
    if (!payload.empty() && outlet->zero_copy() != ZeroCopy::kOff) {
      if (view.copied()) routes_.note_copied(*outlet, device, view.data().size());
      d.lent = payload;
      d.view = std::move(view);
    } else if (!payload.empty()) {
      if (Status st = copy_out(*outlet, payload, &d); !st.is_ok()) {
        routes_.fail(*outlet, device, st);
        return Status::ok();
      }
    }
    view.release();  // a caps or end-of-stream message, or a copied buffer: its block is free again
    routes_.deliver(*outlet, device, frame, std::move(d));
    return Status::ok();
  }

 private:
  static Status copy_out(Outlet& outlet, std::span<const std::byte> payload, Delivery* d) {
    d->payload = outlet.allocate(payload.size());
    if (!d->payload || d->payload->bytes().size() != payload.size()) {
      return {Code::kIoError, "no memory for a buffer of " + std::to_string(payload.size()) + " bytes"};
    }
    std::memcpy(d->payload->bytes().data(), payload.data(), payload.size());  // the one copy of zero-copy=off
    return Status::ok();
  }

  SenderRoutes routes_;
  Assembler assembler_;
};

// -------------------------------------------------------------------------------- ReceiverHub

Status ReceiverHub::attach(const std::string& listen, const std::string& token, std::shared_ptr<Outlet> outlet,
                           std::shared_ptr<ReceiverHub>* out, Transport transport) {
  std::lock_guard reg(registry_mutex);
  std::shared_ptr<ReceiverHub> hub = registry()[listen].lock();
  if (!hub) {
    hub.reset(new ReceiverHub(listen, token, transport));
    SLOTSTREAM_RETURN_IF_ERROR(hub->start());
    registry()[listen] = hub;
  } else if (hub->token_ != token || hub->transport_ != transport) {
    return {Code::kInvalidArgument, "another slotstreamsrc listens on " + listen + " with a different " +
                                        (hub->token_ != token ? "token-file" : "transport") +
                                        ": the srcs of one address share its receiver"};
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
  o.transport = transport_;
  // Lent buffers may hold every block of a sender. The library's default, half, would let units leased to a
  // paused device (its src's queue full) keep the other devices from being lent anything: under load the sender
  // then timed out (max-wait) where the copy path kept flowing. Back-pressure is the same either way: a sender
  // whose blocks are all held waits, nothing is lost.
  o.max_held_blocks = std::numeric_limits<uint32_t>::max();
  // Senders whose protocol holds blocks (status_byte) are lent in place; the others copied (make_sink).
  o.make_view_sink = [this](const SenderInfo& info, std::unique_ptr<ViewSink>* sink) {
    *sink = std::make_unique<ViewRouter>(*this, info);
    return Status::ok();
  };
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
