// UCX's sender engine (Sender::Impl): it groups devices into lanes (connections;
// src/engine/ucx/session/sender_lane.h: handshake, fabric, send ring and the sending thread that owns the
// UCX worker, paper §3.2.4) and owns what they share: the UCX context, per-device pauses, the first
// error, the counters. `Sender` (src/sender.cc) runs it through engine::SenderEngine; filler threads
// reach a lane through DeviceStream (sender.cc here), without a virtual call.
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "common.h"
#include "engine/contract.h"
#include "engine/ucx/fabric/fabric.h"
#include "engine/ucx/protocol/protocol.h"
#include "engine/ucx/session/sender_lane.h"
#include "slotstream/slotstream.h"
#include "wire/control.h"

namespace slotstream {

struct Sender::Impl final : session::LaneOwner, engine::SenderEngine {
  // UCX's checks of the options beyond what the facade checks for every engine (src/sender.cc),
  // the protocol resolved; and the connect that runs them, then connects the lanes.
  static Status validate(const SenderOptions& o, const protocol::Descriptor** desc, protocol::Options* proto_options);
  static Status connect(const SenderOptions& options, std::unique_ptr<Sender>* out);

  SenderOptions options;
  const protocol::Descriptor* desc = nullptr;
  std::string protocol_name;  // desc's, for protocol()
  protocol::Options proto_options;
  Transport chosen = Transport::kShm;
  uint8_t offer_bits = 0;     // what the HELLO offers (less after a failed set-up)
  std::string tried;          // transports whose set-up failed here, and why
  std::string accept_reason;  // the receiver's, for transport()
  std::string reason;         // transport_reason()
  bool lanes_said = false;
  std::unique_ptr<fabric::Context> context;  // shared by the lanes
  std::vector<std::unique_ptr<session::SenderLane>> lanes;
  std::map<uint16_t, session::SenderLane*> lane_of;
  std::map<uint16_t, std::unique_ptr<DeviceStream>> devices;
  struct Confirmation {  // STORED from the receiver (SenderOptions::confirm_stored)
    std::atomic<bool> known{false};
    std::atomic<uint64_t> first{0};
    std::atomic<uint64_t> stored{0};
  };
  std::map<uint16_t, Confirmation> confirmations;  // every declared device, made at connect
  // NUMBERED answers not yet taken by continue_at(), per device.
  std::mutex numbered_mutex;
  std::condition_variable numbered_cv;
  std::map<uint16_t, wire::Numbered> numbered;

  // Devices the receiver paused (PAUSE: their worker is behind); fillers of others go on.
  std::mutex pause_mutex;
  std::condition_variable unpaused;
  std::set<uint16_t> paused;
  std::atomic<size_t> paused_count{0};  // paused.size(), read without the lock on every message

  std::mutex error_mutex;
  Status error;                          // first error of any transmitting thread
  std::atomic<bool> failed_flag{false};  // error is set
  std::atomic<bool> finishing{false};    // finish() was called (any thread)
  // The sending threads have been joined: their protocol counters may be read (stats()).
  std::atomic<bool> joined{false};

  // session::LaneOwner: what each lane uses of the sender (sender_lane.h).
  const SenderOptions& sender_options() const override { return options; }
  const protocol::Descriptor& descriptor() const override { return *desc; }
  const protocol::Options& protocol_options() const override { return proto_options; }
  Status shared_context(const wire::Accept& accept, fabric::Context** out) override {
    const Transport t = accept.transport;
    if (!context) {
      chosen = t;
      const fabric::FabricSpec spec{t, accept.rdma_transport.value_or(RdmaTransport::kRc),
                                    t == Transport::kRdma ? options.rdma.device : ""};
      SLOTSTREAM_RETURN_IF_ERROR(fabric::Context::create(spec, &context));
      for (const std::string& line : context->ucx_overrides()) reason += "; " + line;
    } else if (t != chosen) {
      return {Code::kProtocolError, "receiver chose different transports for one sender's connections"};
    }
    *out = context.get();
    return Status::ok();
  }
  uint8_t offers() const override { return offer_bits; }
  void accepted(const wire::Accept& accept) override {
    if (!lanes.empty()) return;  // the first connection's says it
    reason = tried + transport_name(accept.transport) +
             (accept.rdma_transport ? std::string(" (") + rdma_transport_name(*accept.rdma_transport) + ")" : "") +
             ": " + accept.reason;
  }
  // Only an auto sender's first connection falls back: later lanes must follow the first.
  bool set_up_failed(Transport t, const Status& st) override {
    const uint8_t bit = t == Transport::kShm ? wire::kOfferShm : t == Transport::kRdma ? wire::kOfferRdma : 0;
    if (options.transport != Transport::kAuto || !lanes.empty() || (offer_bits & bit) == 0) return false;
    offer_bits &= uint8_t(~bit);
    tried += std::string(transport_name(t)) + " failed (" + st.message() + "), then ";
    lanes_said = false;
    context.reset();  // made for the failed transport; the lane has released its worker
    return true;
  }
  void connected_over(const std::string& lanes) override {
    if (lanes_said) return;  // the first connection's says it
    lanes_said = true;
    reason += "; UCX lanes: " + lanes;
  }
  bool failed() const override { return failed_flag.load(std::memory_order_acquire); }
  uint64_t messages_sent(uint16_t device) override {
    auto it = devices.find(device);
    return it == devices.end() ? 0 : it->second->messages_.load(std::memory_order_relaxed);
  }
  void fail(Status st) override {
    {
      std::lock_guard lock(error_mutex);
      if (error.is_ok()) error = std::move(st);
      failed_flag.store(true, std::memory_order_release);
      for (auto& lane : lanes) lane->abort();
    }
    {
      std::lock_guard lock(numbered_mutex);
      numbered_cv.notify_all();
    }
    std::lock_guard lock(pause_mutex);
    unpaused.notify_all();
  }
  void set_paused(uint16_t device, bool is_paused) override {
    std::lock_guard lock(pause_mutex);
    if (is_paused) {
      paused.insert(device);
    } else {
      paused.erase(device);
      unpaused.notify_all();
    }
    paused_count.store(paused.size(), std::memory_order_release);
  }
  // Blocks a filler while the receiver has its device paused; the first error ends the wait.
  Status wait_unpaused(uint16_t device, std::optional<std::chrono::steady_clock::time_point> deadline) {
    if (paused_count.load(std::memory_order_acquire) == 0) return Status::ok();  // the common case
    std::unique_lock lock(pause_mutex);
    auto go = [&] { return !paused.contains(device) || !first_error().is_ok(); };
    if (!deadline) {
      unpaused.wait(lock, go);
    } else if (!unpaused.wait_until(lock, *deadline, go)) {
      return {Code::kTimeout, "device " + std::to_string(device) + " is paused by the receiver (its worker is behind)"};
    }
    return first_error();
  }
  Status first_error() override {
    std::lock_guard lock(error_mutex);
    return error;
  }
  void on_stored(const wire::Stored& m) override {
    for (const auto& [d, c] : m.devices) {
      auto it = confirmations.find(d);
      if (it == confirmations.end()) continue;  // not ours: nothing to confirm
      it->second.first.store(c.first, std::memory_order_relaxed);
      it->second.stored.store(c.stored, std::memory_order_release);
      it->second.known.store(true, std::memory_order_release);
    }
  }
  // The device starts again at the answer's number: STORED counts it from there (wire/control.h).
  void on_numbered(const wire::Numbered& m) override {
    if (auto it = confirmations.find(m.device); it != confirmations.end() && m.ok) {
      it->second.first.store(m.number, std::memory_order_relaxed);
      it->second.stored.store(0, std::memory_order_release);
      it->second.known.store(true, std::memory_order_release);
    }
    std::lock_guard lock(numbered_mutex);
    numbered[m.device] = m;
    numbered_cv.notify_all();
  }
  void join_all() {
    for (auto& lane : lanes) lane->stop();
  }
  ~Impl() override {
    if (!finishing.load()) fail({Code::kCancelled, "sender closed before finish()"});
    join_all();
  }

  // engine::SenderEngine
  DeviceStream* device(uint16_t device) override {
    auto it = devices.find(device);
    return it == devices.end() ? nullptr : it->second.get();
  }
  // Not the fillers' path (DeviceStream goes to the lane directly): for callers of the contract.
  Status send_with(uint16_t d, uint64_t length, const DeviceStream::FillFn& fill, engine::Deadline deadline,
                   DeviceStream::Progress* progress) override {
    DeviceStream* stream = device(d);
    if (!stream) return {Code::kInvalidArgument, "device " + std::to_string(d) + " is not declared"};
    return deadline ? stream->send_with(length, fill, *deadline, progress) : stream->send_with(length, fill);
  }
  Status send(uint16_t d, std::span<const std::byte> message, engine::Deadline deadline,
              DeviceStream::Progress* progress) override {
    DeviceStream* stream = device(d);
    if (!stream) return {Code::kInvalidArgument, "device " + std::to_string(d) + " is not declared"};
    return deadline ? stream->send(message, *deadline, progress) : stream->send(message);
  }
  Status finish() override;
  void abort(Status why) override { fail(std::move(why)); }
  SenderStats stats() const override;
  Transport transport() const override { return chosen; }
  const std::string& transport_reason() const override { return reason; }
  const std::string& protocol() const override { return protocol_name; }
  uint32_t blocks() const override { return options.blocks; }
  uint32_t block_size() const override { return options.block_size; }
  Sender::Confirmed confirmed(uint16_t device) const override;
  std::chrono::steady_clock::duration receiver_silence() const override;
  Status continue_at(uint16_t device, uint64_t number, std::chrono::milliseconds timeout) override;
};

}  // namespace slotstream
