// UCX's sender engine (sender.h): its checks and connect, what the lanes share, and DeviceStream's
// path to a lane (packed records and blocks).
#include "engine/ucx/sender.h"

#include <cstring>

#include "engine/ucx/stream/fragment.h"
#include "engine/ucx/stream/send_ring.h"
#include "engine/ucx/stream/trace.h"
#include "random.h"
#include "slotstream/options.h"
#include "wire/block_header.h"

namespace slotstream {

using session::SenderLane;

namespace {

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

// UCX's checks beyond the facade's common ones, and its protocol resolved ("NAME[:key=value,...]"; empty:
// kDefaultProtocol).
Status Sender::Impl::validate(const SenderOptions& o, const protocol::Descriptor** desc,
                              protocol::Options* proto_options) {
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

// Connects every lane; the devices' streams go to their lanes directly (the fillers' path).
Status Sender::Impl::connect(const SenderOptions& options, std::unique_ptr<Sender>* out) {
  const protocol::Descriptor* desc = nullptr;
  protocol::Options proto_options;
  SLOTSTREAM_RETURN_IF_ERROR(validate(options, &desc, &proto_options));
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
  return send_until(message.size(), Source{nullptr, message}, std::nullopt, &progress);
}

Status DeviceStream::send_with(uint64_t length, const FillFn& fill) {
  Progress progress;
  return send_until(length, Source{&fill, {}}, std::nullopt, &progress);
}

Status DeviceStream::send(std::span<const std::byte> message, std::chrono::steady_clock::time_point deadline,
                          Progress* progress) {
  return send_until(message.size(), Source{nullptr, message}, deadline, progress);
}

Status DeviceStream::send_with(uint64_t length, const FillFn& fill, std::chrono::steady_clock::time_point deadline,
                               Progress* progress) {
  return send_until(length, Source{&fill, {}}, deadline, progress);
}

Status DeviceStream::Source::write(uint64_t offset, std::span<std::byte> dst) const {
  if (fill) return (*fill)(offset, dst);
  std::memcpy(dst.data(), message.data() + offset, dst.size());
  return Status::ok();
}

Status DeviceStream::send_until(uint64_t length, const Source& source,
                                std::optional<std::chrono::steady_clock::time_point> deadline, Progress* progress) {
  if (lane_ == nullptr) {  // another engine's device: it takes the message, or send_with's fill function
    return source.fill ? send_other(length, *source.fill, deadline, progress)
                       : sender_.engine_->send(device_, source.message, deadline, progress);
  }
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
  SLOTSTREAM_RETURN_IF_ERROR(small ? send_packed(length, source, deadline)
                                   : send_blocks(length, source, deadline, progress));
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
Status DeviceStream::send_packed(uint64_t length, const Source& source, Deadline deadline) {
  Sender::Impl& im = *sender_.impl_;
  auto& lane = *static_cast<SenderLane*>(lane_);
  stream::SendRing& ring = lane.ring();
  stream::SendRing::Reservation r;
  if (Status st = ring.reserve(uint32_t(wire::packed_record_size(length)), &r, deadline); !st.is_ok()) {
    Status err = im.first_error();
    return err.is_ok() ? st : err;
  }
  // paper §3.2.3: fill the payload, write device and packet number, then mark the record written.
  Status filled = source.write(0, {r.record + wire::kBlockHeaderSize, size_t(length)});
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
Status DeviceStream::send_blocks(uint64_t length, const Source& source, Deadline deadline, Progress* progress) {
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
    Status st = source.write(f.offset, slot.block.subspan(wire::kBlockHeaderSize, f.length));
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
