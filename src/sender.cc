// The sender: a facade that checks its options and runs the engine they choose (src/engine/contract.h): the
// datagram engine (src/engine/dgram/engine.h) for transport udp and the datagram protocols, else UCX's, here.
// UCX's engine (Sender::Impl) groups devices into lanes (connections; src/engine/ucx/session/sender_lane.h:
// handshake, fabric, send ring and the sending thread that owns the UCX worker, paper §3.2.4) and
// owns what they share: the UCX context, per-device pauses, the first error, the counters.
// Filler threads reach a lane only through DeviceStream, without a virtual call.
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <set>

#include "common.h"
#include "engine/contract.h"
#include "engine/dgram/engine.h"
#include "engine/hello_rules.h"
#include "engine/ucx/fabric/fabric.h"
#include "engine/ucx/protocol/protocol.h"
#include "engine/ucx/session/sender_lane.h"
#include "engine/ucx/stream/fragment.h"
#include "engine/ucx/stream/send_ring.h"
#include "engine/ucx/stream/trace.h"
#include "random.h"
#include "slotstream/options.h"
#include "slotstream/slotstream.h"
#include "wire/block_header.h"
#include "wire/control.h"

namespace slotstream {

using session::SenderLane;

namespace {
// What every engine checks: the name, the ranges of the option schema (slotstream/options.h), devices.
Status validate_common(const SenderOptions& o) {
  if (auto why = invalid_sender_name(o.name)) return {Code::kInvalidArgument, *why + " ('" + o.name + "')"};
  SLOTSTREAM_RETURN_IF_ERROR(check_sender_options(o));
  if (o.devices.empty()) return {Code::kInvalidArgument, "no devices declared"};
  // The receiver refuses such a hello too (engine/hello_rules.h): said here before connecting.
  if (auto why = engine::check_devices(o.devices)) return {Code::kInvalidArgument, *why};
  return Status::ok();
}

// UCX's checks, and its protocol resolved ("NAME[:key=value,...]"; empty: kDefaultProtocol).
Status validate(const SenderOptions& o, const protocol::Descriptor** desc, protocol::Options* proto_options) {
  SLOTSTREAM_RETURN_IF_ERROR(validate_common(o));
  if (!o.first_message.empty()) {
    for (uint16_t d : o.devices) {
      if (!o.first_message.contains(d)) {
        return {Code::kInvalidArgument, "first_message names no number for device " + std::to_string(d)};
      }
    }
    if (o.first_message.size() != o.devices.size()) {
      return {Code::kInvalidArgument, "first_message names a device that is not declared"};
    }
  }
  std::string name;
  SLOTSTREAM_RETURN_IF_ERROR(
      protocol::Options::parse_spec(o.protocol.empty() ? kDefaultProtocol : o.protocol, &name, proto_options));
  *desc = protocol::find(name);
  if (!*desc) {
    std::vector<std::string> ucx, dgram;
    for (const ProtocolInfo& p : protocols()) (p.engine == "ucx" ? ucx : dgram).push_back(p.name);
    return {Code::kInvalidArgument, "unknown protocol '" + name + "'; this build has " + join(ucx) +
                                        " (over shm, tcp, rdma) and " + join(dgram) +
                                        " (the datagram transport: transport udp; dgram_rc: tcp); `slotstream "
                                        "protocols` describes them"};
  }
  if ((*desc)->reference && !o.allow_reference) {
    return {Code::kInvalidArgument, "'" + name + "' is a benchmark reference, not a protocol for data"};
  }
  return protocol::check_options(**desc, *proto_options);
}

// Whether this sender offers rdma (auto), or can use it at all (rdma): a usable device, and a
// locked-memory limit that covers the send blocks. Asked of UCX before anything connects, so that
// `--transport rdma` on a host without a device fails at once with what to do.
Status check_rdma(const SenderOptions& o, bool* offer) {
  *offer = false;
  if (o.transport != Transport::kAuto && o.transport != Transport::kRdma) return Status::ok();
  const fabric::FabricSpec spec{Transport::kRdma, o.rdma.transport.value_or(RdmaTransport::kRc), o.rdma.device};
  const fabric::RdmaReport& report = fabric::host_rdma(spec);
  Status st = report.usable
                  ? fabric::check_memlock(spec, uint64_t(o.blocks) * o.block_size + fabric::worker_pinned_bytes(spec),
                                          "the send blocks and UCX's buffers of a worker")
                  : Status{Code::kInvalidArgument, report.why};
  if (st.is_ok()) {
    *offer = true;
    return st;
  }
  if (o.transport == Transport::kAuto) return Status::ok();  // not offered: the receiver picks another
  return {Code::kInvalidArgument, "transport rdma: " + st.message() + "; use --transport tcp (or auto)"};
}

}  // namespace

struct Sender::Impl final : session::LaneOwner, engine::SenderEngine {
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
  std::vector<std::unique_ptr<SenderLane>> lanes;
  std::map<uint16_t, SenderLane*> lane_of;
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

Sender::Sender(std::unique_ptr<engine::SenderEngine> engine)
    : engine_(std::move(engine)),
      impl_(dynamic_cast<Impl*>(engine_.get())) {}

Sender::~Sender() = default;  // the engine ends what is still running

Status Sender::validate(const SenderOptions& options) {
  if (engine::engine_for(options.transport, options.protocol) == engine::Kind::kDatagram) {
    SLOTSTREAM_RETURN_IF_ERROR(validate_common(options));
    return dgram::validate_sender(options);
  }
  const protocol::Descriptor* desc = nullptr;
  protocol::Options proto_options;
  return slotstream::validate(options, &desc, &proto_options);
}

Status Sender::connect(const SenderOptions& options, std::unique_ptr<Sender>* out) {
  if (engine::engine_for(options.transport, options.protocol) == engine::Kind::kDatagram) {
    SLOTSTREAM_RETURN_IF_ERROR(validate_common(options));
    std::unique_ptr<dgram::EngineSender> engine;
    SLOTSTREAM_RETURN_IF_ERROR(dgram::EngineSender::connect(options, &engine));
    dgram::EngineSender& e = *engine;
    std::unique_ptr<Sender> sender(new Sender(std::move(engine)));
    for (uint16_t d : options.devices) e.adopt(d, std::unique_ptr<DeviceStream>(new DeviceStream(*sender, d, nullptr)));
    *out = std::move(sender);
    return Status::ok();
  }
  const protocol::Descriptor* desc = nullptr;
  protocol::Options proto_options;
  SLOTSTREAM_RETURN_IF_ERROR(slotstream::validate(options, &desc, &proto_options));
  bool offer_rdma = false;
  SLOTSTREAM_RETURN_IF_ERROR(check_rdma(options, &offer_rdma));
  std::unique_ptr<Sender> sender(new Sender(std::make_unique<Impl>()));
  Impl& im = *sender->impl_;
  im.options = options;
  im.desc = desc;
  im.protocol_name = std::string(desc->name);
  im.proto_options = proto_options;
  const bool shm = options.transport == Transport::kAuto || options.transport == Transport::kShm;
  im.offer_bits = uint8_t((shm ? wire::kOfferShm : 0) | (offer_rdma ? wire::kOfferRdma : 0));

  // Group the devices into lanes (connections).
  std::vector<std::vector<uint16_t>> groups;
  if (desc->connection_per_device) {
    for (uint16_t d : options.devices) groups.push_back({d});
  } else {
    groups.push_back(options.devices);
  }
  if (groups.size() > 65535) return {Code::kInvalidArgument, "too many connections"};
  uint64_t group_id = 0;
  if (Status st = random_u64(&group_id); !st.is_ok()) return st;

  wire::Hello hello;
  hello.protocol = std::string(desc->name);
  hello.options = proto_options.text();
  hello.blocks = options.blocks;
  hello.block_size = options.block_size;
  hello.transport = options.transport;
  hello.rdma_transport = options.rdma.transport;
  hello.host_id = host_id();
  hello.shm_domain = shm_domain();
  hello.name = options.name;
  hello.group = group_id;
  hello.lanes = static_cast<uint16_t>(groups.size());
  // Before the lanes connect: each handshake ends with the receiver's first STORED (confirm_stored).
  for (uint16_t d : options.devices) im.confirmations[d];
  for (size_t i = 0; i < groups.size(); ++i) {
    auto lane = std::make_unique<SenderLane>(im, static_cast<uint16_t>(i), groups[i]);
    SLOTSTREAM_RETURN_IF_ERROR(lane->connect(options.host, options.port, hello));
    for (uint16_t d : lane->devices()) im.lane_of[d] = lane.get();
    im.lanes.push_back(std::move(lane));
  }
  for (uint16_t d : options.devices) {
    im.devices[d].reset(new DeviceStream(*sender, d, im.lane_of.at(d)));
  }
  for (auto& lane : im.lanes) lane->start();
  *out = std::move(sender);
  return Status::ok();
}

// ------------------------------------------------------------------------------ the facade

DeviceStream* Sender::device(uint16_t device) { return engine_->device(device); }
Status Sender::finish() { return engine_->finish(); }
void Sender::abort(Status why) { engine_->abort(std::move(why)); }
SenderStats Sender::stats() const { return engine_->stats(); }
Transport Sender::transport() const { return engine_->transport(); }
const std::string& Sender::transport_reason() const { return engine_->transport_reason(); }
const std::string& Sender::protocol() const { return engine_->protocol(); }
uint32_t Sender::blocks() const { return engine_->blocks(); }
uint32_t Sender::block_size() const { return engine_->block_size(); }
Status Sender::continue_at(uint16_t device, uint64_t number, std::chrono::milliseconds timeout) {
  return engine_->continue_at(device, number, timeout);
}
Sender::Confirmed Sender::confirmed(uint16_t device) const { return engine_->confirmed(device); }
std::chrono::steady_clock::duration Sender::receiver_silence() const { return engine_->receiver_silence(); }

// -------------------------------------------------------------------------- UCX's engine

Status Sender::Impl::finish() {
  if (finishing.exchange(true)) return first_error();
  join_all();
  Status st = first_error();
  // fin() progresses each lane's worker, whose handlers (credit updates, ACKs) still write protocol
  // counters: stats() may read those only after the last fin() returned.
  for (auto& lane : lanes) {
    if (!st.is_ok()) break;
    st = lane->fin();
  }
  joined.store(true, std::memory_order_release);
  return st;
}

std::chrono::steady_clock::duration Sender::Impl::receiver_silence() const {
  const auto now = std::chrono::steady_clock::now();
  std::chrono::steady_clock::duration longest{0};
  for (auto& lane : lanes) longest = std::max(longest, now - lane->heard());
  return longest;
}

SenderStats Sender::Impl::stats() const {
  SenderStats s;
  for (auto& [d, dev] : devices) {
    s.per_device[d] = dev->messages_.load(std::memory_order_relaxed);
    s.messages += s.per_device[d];
    s.bytes += dev->bytes_.load(std::memory_order_relaxed);
  }
  if (!joined.load(std::memory_order_acquire)) {  // the sending threads own protocol counters
    for (auto& lane : lanes) s.held_skips += lane->held_skips_live();
    return s;
  }
  for (auto& lane : lanes) {
    if (!lane->protocol()) continue;
    protocol::ProtocolStats c = lane->protocol()->stats();
    s.records += lane->records();
    s.units += lane->units();
    s.sync_operations += c.sync_ops;
    s.held_skips += c.held_skips;
    s.waits += c.waits;
    s.wait_ns += c.wait_ns;
    s.wait_samples_ns.insert(s.wait_samples_ns.end(), c.wait_samples_ns.begin(), c.wait_samples_ns.end());
    s.sync_op_samples_ns.insert(s.sync_op_samples_ns.end(), c.sync_op_samples_ns.begin(), c.sync_op_samples_ns.end());
    for (const auto& [k, v] : c.counters) s.protocol_counters[k] += v;
  }
  s.connections = lanes.size();
  return s;
}

// NUMBER, then the answer (NUMBERED), which the lane's sending thread reads with the others.
Status Sender::Impl::continue_at(uint16_t device, uint64_t number, std::chrono::milliseconds timeout) {
  auto lane = lane_of.find(device);
  if (lane == lane_of.end()) return {Code::kInvalidArgument, "device " + std::to_string(device) + " is not declared"};
  {
    std::lock_guard lock(numbered_mutex);
    numbered.erase(device);
  }
  SLOTSTREAM_RETURN_IF_ERROR(first_error());
  SLOTSTREAM_RETURN_IF_ERROR(lane->second->number(wire::Number{device, number}));
  std::unique_lock lock(numbered_mutex);
  const bool answered = numbered_cv.wait_for(lock, timeout, [&] { return numbered.contains(device) || failed(); });
  SLOTSTREAM_RETURN_IF_ERROR(first_error());
  if (!answered) return {Code::kTimeout, "the receiver did not answer NUMBER for device " + std::to_string(device)};
  const wire::Numbered a = numbered.at(device);
  if (!a.ok) return {Code::kRefused, "receiver: " + a.message};
  return Status::ok();
}

Sender::Confirmed Sender::Impl::confirmed(uint16_t device) const {
  Confirmed c;
  auto it = confirmations.find(device);
  if (it == confirmations.end() || !it->second.known.load(std::memory_order_acquire)) return c;
  c.stored = it->second.stored.load(std::memory_order_acquire);
  c.first = it->second.first.load(std::memory_order_relaxed);
  return c;
}

// ----------------------------------------------------------------------------- DeviceStream

Status DeviceStream::send(std::span<const std::byte> message) {
  Progress progress;
  if (lane_ == nullptr) return sender_.engine_->send(device_, message, std::nullopt, &progress);
  return send_until(message.size(), copy_from(message), std::nullopt, &progress);
}

Status DeviceStream::send_with(uint64_t length, const FillFn& fill) {
  Progress progress;
  return send_until(length, fill, std::nullopt, &progress);
}

Status DeviceStream::send(std::span<const std::byte> message, std::chrono::steady_clock::time_point deadline,
                          Progress* progress) {
  if (lane_ == nullptr) return sender_.engine_->send(device_, message, deadline, progress);
  return send_until(message.size(), copy_from(message), deadline, progress);
}

Status DeviceStream::send_with(uint64_t length, const FillFn& fill, std::chrono::steady_clock::time_point deadline,
                               Progress* progress) {
  return send_until(length, fill, deadline, progress);
}

DeviceStream::FillFn DeviceStream::copy_from(std::span<const std::byte> message) {
  return [message](uint64_t offset, std::span<std::byte> dst) {
    std::memcpy(dst.data(), message.data() + offset, dst.size());
    return Status::ok();
  };
}

Status DeviceStream::send_until(uint64_t length, const FillFn& fill,
                                std::optional<std::chrono::steady_clock::time_point> deadline, Progress* progress) {
  if (lane_ == nullptr) return send_other(length, fill, deadline, progress);
  Sender::Impl& im = *sender_.impl_;
  // A failed sender (its receiver lost: the sending thread saw the control socket close) refuses at
  // once. A small message would otherwise be packed into the ring's open block, which nothing
  // transmits any more, and the loss would surface only once every send block was full: 36 s for
  // 64x48 frames at 25 fps with the default 32 blocks of 1 MiB. One load of a flag written once.
  if (im.failed()) return im.first_error();
  // Back-pressure for this device alone (its worker on the receiver is behind).
  if (progress->next_fragment == 0) {
    SLOTSTREAM_RETURN_IF_ERROR(im.wait_unpaused(device_, deadline));
  }
  auto& lane = *static_cast<SenderLane*>(lane_);
  const bool small = length <= im.options.block_size - wire::kBlockHeaderSize &&
                     wire::packed_record_size(length) <= lane.ring().max_packed();
  SLOTSTREAM_RETURN_IF_ERROR(small ? send_packed(length, fill, deadline)
                                   : send_blocks(length, fill, deadline, progress));
  // One thread per device writes these: a load and a store, no locked instruction.
  messages_.store(messages_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  bytes_.store(bytes_.load(std::memory_order_relaxed) + length, std::memory_order_relaxed);
  return Status::ok();
}

Status DeviceStream::send_other(uint64_t length, const FillFn& fill, Deadline deadline, Progress* progress) {
  return sender_.engine_->send_with(device_, length, fill, deadline, progress);
}

uint32_t DeviceStream::take_packet() {
  if (const uint32_t every = sender_.impl_->options.skip_packet_every; every && next_packet_ % (every + 1) == every) {
    ++next_packet_;  // testing aid: this packet number is never sent (SenderOptions)
  }
  return next_packet_++;
}

// A small message: one record appended to the lane's open block (engine/ucx/stream/send_ring.h) — one atomic
// add to reserve it, a copy, a store to publish it. It leaves with the block: at once if the lane
// is idle (this filler transmits it), else with whatever the busy lane collects meanwhile.
Status DeviceStream::send_packed(uint64_t length, const FillFn& fill, Deadline deadline) {
  Sender::Impl& im = *sender_.impl_;
  auto& lane = *static_cast<SenderLane*>(lane_);
  stream::SendRing& ring = lane.ring();
  stream::SendRing::Reservation r;
  if (Status st = ring.reserve(uint32_t(wire::packed_record_size(length)), &r, deadline); !st.is_ok()) {
    Status err = im.first_error();
    return err.is_ok() ? st : err;
  }
  // paper §3.2.3: fill the payload, write device and packet number, then mark the record written.
  Status filled = fill(0, {r.record + wire::kBlockHeaderSize, size_t(length)});
  wire::BlockHeader h{wire::kFirstFragment | wire::kLastFragment, device_, 0, uint32_t(length)};
  if (filled.is_ok()) {
    h.packet = take_packet();
  } else {  // the space is reserved: it leaves as a void record the receiver skips
    h = {wire::kVoid, device_, 0, r.size - uint32_t(wire::kBlockHeaderSize)};
  }
  wire::encode_block_header(h, std::span<std::byte, wire::kBlockHeaderSize>(r.record, wire::kBlockHeaderSize));
  ring.publish(r);
  if (filled.is_ok()) stream::trace(stream::TraceStage::kCommitted, device_, h.packet);
  if (r.lane_idle) {
    SLOTSTREAM_RETURN_IF_ERROR(lane.help());
  } else if (r.wake) {
    ring.wake_sender();
  }
  return filled;
}

// A message too large to pack (or packing off): a block per fragment, as the paper does.
Status DeviceStream::send_blocks(uint64_t length, const FillFn& fill, Deadline deadline, Progress* progress) {
  Sender::Impl& im = *sender_.impl_;
  auto& lane = *static_cast<SenderLane*>(lane_);
  stream::SendRing& ring = lane.ring();
  const uint32_t capacity = im.options.block_size - uint32_t(wire::kBlockHeaderSize);
  const uint64_t n = stream::fragment_count(length, capacity);
  for (uint64_t i = progress->next_fragment; i < n; ++i) {
    stream::Fragment f = stream::fragment_at(length, capacity, i);
    stream::SendRing::Slot slot;
    if (Status st = ring.claim(&slot, deadline); !st.is_ok()) {
      Status err = im.first_error();
      progress->next_fragment = i;  // a timeout: the caller may continue from here
      return err.is_ok() ? st : err;
    }
    // paper §3.2.3: fill the payload, write device and packet number, then mark the block full.
    Status st = fill(f.offset, slot.block.subspan(wire::kBlockHeaderSize, f.length));
    if (!st.is_ok()) {
      ring.commit(slot, 0);  // gives the block back unsent; the receiver drops the partial message
      (void)lane.help();
      return st;
    }
    wire::BlockHeader h{f.flags, device_, take_packet(), f.length};
    wire::encode_block_header(h, slot.block.first<wire::kBlockHeaderSize>());
    ring.commit(slot, uint32_t(wire::kBlockHeaderSize + f.length));
    stream::trace(stream::TraceStage::kCommitted, device_, h.packet);
    // Without a deadline the filler waits for receiver room itself (a hand-off per block would make
    // the sending thread a third busy thread). With one it transmits only while the receiver
    // has room (SenderLane::help hands the lane to the sending thread otherwise), so it waits only
    // in claim() and wait_unpaused(), which give up in time.
    SLOTSTREAM_RETURN_IF_ERROR(lane.help(/*wait_whole=*/!deadline));
  }
  progress->next_fragment = 0;
  return Status::ok();
}

}  // namespace slotstream
