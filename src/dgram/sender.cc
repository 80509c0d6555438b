#include "dgram/sender.h"

#include <climits>
#include <mutex>

#include "clock.h"
#include "dgram/protocol.h"
#include "dgram/segments.h"
#include "dgram/sender_handshake.h"
#include "dgram/sender_link.h"

namespace slotstream::dgram {
namespace {

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kFinInterval = 200 * kMs;

std::span<const uint8_t> as_u8(std::span<const std::byte> s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

Status check_options(const DatagramSenderOptions& o, const Descriptor* proto) {
  if (!proto) return {Code::kInvalidArgument, "unknown datagram protocol '" + o.protocol + "'"};
  if (o.devices.empty()) return {Code::kInvalidArgument, "no devices"};
  if (o.ring == 0 || o.ring > 1024) return {Code::kInvalidArgument, "ring (STags per device) must be 1..1024"};
  if (o.segment_size < 64 || o.segment_size > kMaxSegmentPayload) {
    return {Code::kInvalidArgument,
            "segment size must be 64.." + std::to_string(kMaxSegmentPayload) + " B (one UDP datagram with headers)"};
  }
  if (o.inject.any() && proto->over_tcp) {
    return {Code::kInvalidArgument,
            "fault injection applies to datagrams; dgram_rc runs over TCP "
            "(use an nftables rule for real loss on both)"};
  }
  if (o.devices.size() > kMaxHelloDevices) {
    return {Code::kInvalidArgument, "at most " + std::to_string(kMaxHelloDevices) + " devices per datagram sender"};
  }
  return Status::ok();
}

// A lower layer's "port unreachable" names the socket call; the user wants to know who is gone.
Status peer_named(Status st, const Address& peer) {
  if (st.code() != Code::kPeerGone || st.message().starts_with("receiver")) return st;
  return {Code::kPeerGone, "the receiver at " + peer.str() + " is gone (" + st.message() + ")"};
}

}  // namespace

// One session with one receiver: messages numbered per device, their segments (the protocol's), and
// the end (FIN parts -> FIN_ACK parts). The link and the handshake are units of their own.
struct DatagramSender::Impl {
  DatagramSenderOptions o;
  const Descriptor* proto = nullptr;
  mutable std::mutex mu;
  std::unique_ptr<SenderLink> link;
  std::unique_ptr<SenderHandshake> handshake;
  struct Device {
    size_t index = 0;  // in the HELLO's list: its STags are first_stag + index * ring ...
    uint32_t next_msn = 0;
    uint64_t bytes = 0;
  };
  std::map<uint16_t, Device> devices;
  std::map<uint16_t, FinAck> fin_acks;  // FIN_ACK parts received, by their first device
  DatagramSenderStats stats;

  size_t fin_part_count() const { return (o.devices.size() + kFinPartDevices - 1) / kFinPartDevices; }
  bool all_fin_acked() const { return fin_acks.size() >= fin_part_count(); }

  void on_fin_ack(std::span<const uint8_t> p) {
    auto f = decode_fin_ack(p);
    if (!f || f->total != o.devices.size() || f->first % kFinPartDevices != 0) return;
    for (size_t i = 0; i < f->devices.size(); ++i) {
      if (f->devices[i].device != o.devices[f->first + i]) return;
    }
    fin_acks.emplace(f->first, std::move(*f));
  }

  // A datagram from the receiver: its MAC (once the session has keys), RD's ack, a control message.
  void on_segment(std::span<const std::byte> d) {
    auto seg = decode_segment(d);
    if (!seg) return;  // damaged or foreign: the receiver repeats what matters
    const SegmentHeader& h = seg->header;
    const bool control = h.opcode == Opcode::kSend && h.queue == kControlQueue;
    const auto type = control ? control_type(as_u8(seg->payload)) : std::nullopt;
    if (SegmentMac* mac = handshake->rx_mac(); mac && !mac->verify(*seg)) {
      // A late copy of the handshake's own answers is unsigned; anything else is forged.
      if (type != ControlType::kAccept && type != ControlType::kChallenge && type != ControlType::kRefuse) {
        ++stats.forged;
      }
      return;
    }
    link->on_ack(h);
    if (type == ControlType::kFinAck) return on_fin_ack(as_u8(seg->payload));
    if (type) handshake->on_control(*type, as_u8(seg->payload));
  }

  // The link's progress; over TCP the receiver closing after its last FIN_ACK is the end, not an error.
  Status progress(int timeout_ms) {
    Status st = link->progress(timeout_ms);
    if (st.code() == Code::kPeerGone && link->over_tcp() && all_fin_acked()) return Status::ok();
    return st;
  }

  Status send_message(uint16_t device, std::span<const std::byte> m) {
    auto it = devices.find(device);
    if (it == devices.end()) {
      return {Code::kInvalidArgument, "device " + std::to_string(device) + " was not declared at connect"};
    }
    if (m.size() > o.max_message) {
      return {Code::kInvalidArgument, "message of " + std::to_string(m.size()) + " B is larger than the declared " +
                                          std::to_string(o.max_message) + " B"};
    }
    Device& dev = it->second;
    if (dev.next_msn == UINT32_MAX) return {Code::kInvalidArgument, "2^32 - 1 messages per device and session at most"};
    const MessageSlot slot{device, dev.index, dev.next_msn++, o.ring, handshake->first_stag(), m.size()};
    SLOTSTREAM_RETURN_IF_ERROR(send_segments(slot, m));
    SLOTSTREAM_RETURN_IF_ERROR(link->end_message());
    ++stats.messages;
    stats.bytes += m.size();
    ++stats.per_device[device];
    dev.bytes += m.size();
    return Status::ok();
  }

  // The message in segments of at most segment_size bytes, then whatever completes it (RC's Send).
  Status send_segments(const MessageSlot& slot, std::span<const std::byte> m) {
    SegmentHeader h = proto->data_header(slot);
    h.service = proto->service;
    Status st = Status::ok();
    for_each_segment(h, m.size(), o.segment_size, [&](const SegmentHeader& s, uint64_t off, uint64_t n) {
      st = link->emit(s, m.subspan(off, n));
      return st.is_ok();
    });
    SLOTSTREAM_RETURN_IF_ERROR(st);
    if (!proto->notice) return Status::ok();
    const auto notice = proto->notice(slot);
    return notice ? link->emit(notice->header, notice->payload) : Status::ok();
  }

  // FIN in parts of kFinPartDevices devices, each padded to the size of its answer.
  std::vector<std::vector<uint8_t>> fin_parts() const {
    std::vector<Fin::Device> all;
    for (uint16_t d : o.devices) all.push_back({d, devices.at(d).next_msn, devices.at(d).bytes});
    std::vector<std::vector<uint8_t>> parts;
    for (size_t first = 0; first < all.size(); first += kFinPartDevices) {
      Fin f;
      f.total = uint16_t(all.size());
      f.first = uint16_t(first);
      f.devices.assign(all.begin() + ptrdiff_t(first),
                       all.begin() + ptrdiff_t(std::min(all.size(), first + kFinPartDevices)));
      f.padding = fin_padding(f.devices.size());
      parts.push_back(encode_control(f));
    }
    return parts;
  }

  // FIN parts until every FIN_ACK part is in: over UDP those not yet answered, again and again; over
  // TCP each once.
  Status exchange_fin() {
    const auto parts = fin_parts();
    const int64_t deadline = now_ns() + o.finish_timeout_ns;
    int64_t next_fin = 0;
    while (!all_fin_acked()) {
      const int64_t now = now_ns();
      if (now >= deadline) {
        return {Code::kTimeout, "the receiver at " + link->peer().str() +
                                    " did not confirm the end of the stream within " +
                                    std::to_string(o.finish_timeout_ns / 1'000'000'000) + " s"};
      }
      if (now >= next_fin && (!link->over_tcp() || next_fin == 0)) {
        for (size_t i = 0; i < parts.size(); ++i) {
          if (!fin_acks.contains(uint16_t(i * kFinPartDevices)))
            SLOTSTREAM_RETURN_IF_ERROR(link->send_control(parts[i]));
        }
        next_fin = now + kFinInterval;
      }
      SLOTSTREAM_RETURN_IF_ERROR(progress(20));
    }
    return Status::ok();
  }

  Status finish(FinAck* report) {
    SLOTSTREAM_RETURN_IF_ERROR(link->flush());
    if (proto->sequenced) {
      while (!link->all_acked()) SLOTSTREAM_RETURN_IF_ERROR(progress(5));
    }
    SLOTSTREAM_RETURN_IF_ERROR(exchange_fin());
    if (report) {
      report->devices.clear();
      for (auto& [_, part] : fin_acks)
        report->devices.insert(report->devices.end(), part.devices.begin(), part.devices.end());
      report->total = uint16_t(o.devices.size());
    }
    return Status::ok();
  }
};

DatagramSender::DatagramSender(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DatagramSender::~DatagramSender() = default;

Status DatagramSender::connect(const DatagramSenderOptions& o, std::unique_ptr<DatagramSender>* out) {
  auto impl = std::make_unique<Impl>();
  impl->o = o;
  impl->proto = find_protocol(o.protocol);
  SLOTSTREAM_RETURN_IF_ERROR(check_options(o, impl->proto));
  for (size_t i = 0; i < o.devices.size(); ++i) {
    auto [it, fresh] = impl->devices.try_emplace(o.devices[i]);
    if (!fresh) return {Code::kInvalidArgument, "device " + std::to_string(o.devices[i]) + " is listed twice"};
    it->second.index = i;
  }
  LinkOptions lo{o.host, o.port, o.socket_buffer, o.inject, o.handshake_timeout_ns};
  SLOTSTREAM_RETURN_IF_ERROR(SenderLink::open(*impl->proto, lo, &impl->link));
  Impl* im = impl.get();
  im->link->set_receiver([im](std::span<const std::byte> d) { im->on_segment(d); });
  HandshakeOptions ho{o.name, o.devices, o.ring, o.max_message, o.segment_size, o.token, o.handshake_timeout_ns};
  im->handshake = std::make_unique<SenderHandshake>(ho, *im->proto, *im->link);
  SLOTSTREAM_RETURN_IF_ERROR(im->handshake->run());
  out->reset(new DatagramSender(std::move(impl)));
  return Status::ok();
}

Status DatagramSender::send(uint16_t device, std::span<const std::byte> message) {
  std::lock_guard lock(impl_->mu);
  return peer_named(impl_->send_message(device, message), impl_->link->peer());
}

Status DatagramSender::send_with(uint16_t device, uint64_t length, const FillFn& fill) {
  // Not zero-filled first: `fill` writes every byte (a 50 MB file would otherwise be written twice).
  auto buf = std::make_unique_for_overwrite<std::byte[]>(length);
  const std::span<std::byte> message(buf.get(), length);
  SLOTSTREAM_RETURN_IF_ERROR(fill(0, message));
  std::lock_guard lock(impl_->mu);
  return peer_named(impl_->send_message(device, message), impl_->link->peer());
}

Status DatagramSender::finish(FinAck* report) {
  std::lock_guard lock(impl_->mu);
  return peer_named(impl_->finish(report), impl_->link->peer());
}

DatagramSenderStats DatagramSender::stats() const {
  std::lock_guard lock(impl_->mu);
  DatagramSenderStats s = impl_->stats;
  s.datagrams = impl_->link->stats().datagrams;
  s.credit_waits = impl_->link->stats().credit_waits;
  s.retransmits = impl_->link->rd_stats().retransmits;
  s.timeouts = impl_->link->rd_stats().timeouts;
  if (const auto* f = impl_->link->injected()) {
    s.injected_loss = f->dropped;
    s.injected_corrupt = f->corrupted;
    s.injected_duplicate = f->duplicated;
    s.injected_reorder = f->reordered;
  }
  return s;
}

const std::string& DatagramSender::protocol() const { return impl_->o.protocol; }
uint32_t DatagramSender::segment_size() const { return impl_->o.segment_size; }

}  // namespace slotstream::dgram
