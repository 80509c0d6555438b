// The sender: checks its options, groups devices into lanes (connections; src/session/sender_lane.h:
// handshake, fabric, send ring and the sending thread that owns the UCX worker, paper §3.2.4) and
// owns what they share: the UCX context, per-device pauses, the first error, the counters.
// Filler threads reach a lane only through DeviceStream.
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <set>

#include "common.h"
#include "fabric/fabric.h"
#include "protocol/protocol.h"
#include "random.h"
#include "session/sender_lane.h"
#include "slotstream/slotstream.h"
#include "stream/fragment.h"
#include "stream/send_ring.h"
#include "stream/trace.h"
#include "wire/block_header.h"
#include "wire/control.h"

namespace slotstream {

using session::SenderLane;

namespace {
// Checks the options and resolves the protocol ("NAME[:key=value,...]").
Status validate(const SenderOptions& o, const protocol::Descriptor** desc, protocol::Options* proto_options) {
  if (auto why = invalid_sender_name(o.name)) return {Code::kInvalidArgument, *why + " ('" + o.name + "')"};
  if (o.transport == Transport::kUdp) return {Code::kInvalidArgument, kUdpNotHere};
  if (o.block_size < kMinBlockSize || o.block_size > kMaxBlockSize) {
    return {Code::kInvalidArgument,
            "block size must be " + std::to_string(kMinBlockSize) + ".." + std::to_string(kMaxBlockSize) + " bytes"};
  }
  if (o.blocks < 1 || o.blocks > kMaxBlocks) {
    return {Code::kInvalidArgument, "blocks must be 1.." + std::to_string(kMaxBlocks)};
  }
  if (o.devices.empty()) return {Code::kInvalidArgument, "no devices declared"};
  if (o.stall_timeout.count() < 0 || (o.stall_timeout.count() > 0 && o.stall_timeout < kMinStallTimeout)) {
    return {Code::kInvalidArgument, "stall timeout must be 0 (wait for ever) or at least " +
                                        std::to_string(kMinStallTimeout.count()) +
                                        " ms (a receiver says it is alive every second), got " +
                                        std::to_string(o.stall_timeout.count()) + " ms"};
  }
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
  SLOTSTREAM_RETURN_IF_ERROR(protocol::Options::parse_spec(o.protocol, &name, proto_options));
  *desc = protocol::find(name);
  if (!*desc) {
    std::string known;
    for (const ProtocolInfo& p : protocols()) known += (known.empty() ? "" : ", ") + p.name;
    return {Code::kInvalidArgument,
            "unknown protocol '" + name + "'; this build has " + known + " (`slotstream protocols` describes them)"};
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

struct Sender::Impl : session::LaneOwner {
  SenderOptions options;
  const protocol::Descriptor* desc = nullptr;
  protocol::Options proto_options;
  Transport transport = Transport::kShm;
  uint8_t offer_bits = 0;     // what the HELLO offers (less after a failed set-up)
  std::string tried;          // transports whose set-up failed here, and why
  std::string accept_reason;  // the receiver's, for transport()
  std::string transport_reason;
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
      transport = t;
      const fabric::FabricSpec spec{t, accept.rdma_transport.value_or(RdmaTransport::kRc),
                                    t == Transport::kRdma ? options.rdma.device : ""};
      SLOTSTREAM_RETURN_IF_ERROR(fabric::Context::create(spec, &context));
      for (const std::string& line : context->ucx_overrides()) transport_reason += "; " + line;
    } else if (t != transport) {
      return {Code::kProtocolError, "receiver chose different transports for one sender's connections"};
    }
    *out = context.get();
    return Status::ok();
  }
  uint8_t offers() const override { return offer_bits; }
  void accepted(const wire::Accept& accept) override {
    if (!lanes.empty()) return;  // the first connection's says it
    transport_reason =
        tried + transport_name(accept.transport) +
        (accept.rdma_transport ? std::string(" (") + rdma_transport_name(*accept.rdma_transport) + ")" : "") + ": " +
        accept.reason;
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
    transport_reason += "; UCX lanes: " + lanes;
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
  Status continue_at(uint16_t device, uint64_t number, std::chrono::milliseconds timeout);
  void join_all() {
    for (auto& lane : lanes) lane->stop();
  }
};

Sender::Sender(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Sender::~Sender() {
  if (!impl_->finishing.load()) impl_->fail({Code::kCancelled, "sender closed before finish()"});
  impl_->join_all();
}

Status Sender::validate(const SenderOptions& options) {
  const protocol::Descriptor* desc = nullptr;
  protocol::Options proto_options;
  return slotstream::validate(options, &desc, &proto_options);
}

Status Sender::connect(const SenderOptions& options, std::unique_ptr<Sender>* out) {
  const protocol::Descriptor* desc = nullptr;
  protocol::Options proto_options;
  SLOTSTREAM_RETURN_IF_ERROR(slotstream::validate(options, &desc, &proto_options));
  bool offer_rdma = false;
  SLOTSTREAM_RETURN_IF_ERROR(check_rdma(options, &offer_rdma));
  std::unique_ptr<Sender> sender(new Sender(std::make_unique<Impl>()));
  Impl& im = *sender->impl_;
  im.options = options;
  im.desc = desc;
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

DeviceStream* Sender::device(uint16_t device) {
  auto it = impl_->devices.find(device);
  return it == impl_->devices.end() ? nullptr : it->second.get();
}

Status Sender::finish() {
  Impl& im = *impl_;
  if (im.finishing.exchange(true)) return im.first_error();
  im.join_all();
  Status st = im.first_error();
  // fin() progresses each lane's worker, whose handlers (credit updates, ACKs) still write protocol
  // counters: stats() may read those only after the last fin() returned.
  for (auto& lane : im.lanes) {
    if (!st.is_ok()) break;
    st = lane->fin();
  }
  im.joined.store(true, std::memory_order_release);
  return st;
}

void Sender::abort(Status why) { impl_->fail(std::move(why)); }

std::chrono::steady_clock::duration Sender::receiver_silence() const {
  const auto now = std::chrono::steady_clock::now();
  std::chrono::steady_clock::duration longest{0};
  for (auto& lane : impl_->lanes) longest = std::max(longest, now - lane->heard());
  return longest;
}

SenderStats Sender::stats() const {
  SenderStats s;
  for (auto& [d, dev] : impl_->devices) {
    s.per_device[d] = dev->messages_.load(std::memory_order_relaxed);
    s.messages += s.per_device[d];
    s.bytes += dev->bytes_.load(std::memory_order_relaxed);
  }
  if (!impl_->joined.load(std::memory_order_acquire)) {  // the sending threads own protocol counters
    for (auto& lane : impl_->lanes) s.held_skips += lane->held_skips_live();
    return s;
  }
  for (auto& lane : impl_->lanes) {
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
  s.connections = impl_->lanes.size();
  return s;
}

Transport Sender::transport() const { return impl_->transport; }
const std::string& Sender::transport_reason() const { return impl_->transport_reason; }
uint32_t Sender::blocks() const { return impl_->options.blocks; }
uint32_t Sender::block_size() const { return impl_->options.block_size; }

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

Status Sender::continue_at(uint16_t device, uint64_t number, std::chrono::milliseconds timeout) {
  return impl_->continue_at(device, number, timeout);
}

Sender::Confirmed Sender::confirmed(uint16_t device) const {
  Confirmed c;
  auto it = impl_->confirmations.find(device);
  if (it == impl_->confirmations.end() || !it->second.known.load(std::memory_order_acquire)) return c;
  c.stored = it->second.stored.load(std::memory_order_acquire);
  c.first = it->second.first.load(std::memory_order_relaxed);
  return c;
}

// ----------------------------------------------------------------------------- DeviceStream

Status DeviceStream::send(std::span<const std::byte> message) {
  Progress progress;
  return send_until(message.size(), copy_from(message), std::nullopt, &progress);
}

Status DeviceStream::send_with(uint64_t length, const FillFn& fill) {
  Progress progress;
  return send_until(length, fill, std::nullopt, &progress);
}

Status DeviceStream::send(std::span<const std::byte> message, std::chrono::steady_clock::time_point deadline,
                          Progress* progress) {
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

uint32_t DeviceStream::take_packet() {
  if (const uint32_t every = sender_.impl_->options.skip_packet_every; every && next_packet_ % (every + 1) == every) {
    ++next_packet_;  // testing aid: this packet number is never sent (SenderOptions)
  }
  return next_packet_++;
}

// A small message: one record appended to the lane's open block (stream/send_ring.h) — one atomic
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
    // Without a deadline the filler waits for receiver room itself (issue 32: a hand-off per block
    // made the sending thread a third busy thread). With one it transmits only while the receiver
    // has room (SenderLane::help hands the lane to the sending thread otherwise), so it waits only
    // in claim() and wait_unpaused(), which give up in time.
    SLOTSTREAM_RETURN_IF_ERROR(lane.help(/*wait_whole=*/!deadline));
  }
  progress->next_fragment = 0;
  return Status::ok();
}

}  // namespace slotstream
