#include "engine/dgram/send/sender.h"

#include <climits>
#include <mutex>

#include "clock.h"
#include "engine/dgram/protocol/protocol.h"
#include "engine/dgram/send/sender_handshake.h"
#include "engine/dgram/send/sender_link.h"
#include "engine/dgram/wire/segments.h"
#include "engine/hello_rules.h"

namespace slotstream::dgram {
namespace {

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kFinInterval = 200 * kMs;
// A multicast sender's ANNOUNCE: this many copies before its first segment, again this often, and its
// FIN parts this many times (engine/dgram/wire/control.h).
constexpr int kFirstAnnounces = 3;
constexpr int64_t kAnnounceInterval = 200 * kMs;
constexpr int kMulticastFins = 5;
// A UD or RC sender looks for a TERMINATE from the receiver this often while it sends.
constexpr int64_t kPollInterval = 20 * kMs;

std::span<const uint8_t> as_u8(std::span<const std::byte> s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

Status check_options(const DatagramSenderOptions& o, const Descriptor* proto) {
  if (!proto) return {Code::kInvalidArgument, "unknown datagram protocol '" + o.protocol + "'"};
  if (auto why = engine::check_devices(o.devices)) return {Code::kInvalidArgument, *why};
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
  return Status::ok();
}

// The control message a segment carries, if it is one (a Send on the control queue).
std::optional<ControlType> control_type_of(const Segment& seg) {
  const SegmentHeader& h = seg.header;
  if (h.opcode != Opcode::kSend || h.queue != kControlQueue) return std::nullopt;
  return control_type({reinterpret_cast<const uint8_t*>(seg.payload.data()), seg.payload.size()});
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
  bool multicast = false;   // to an IP multicast group: ANNOUNCE instead of the handshake, FIN unanswered
  uint32_t first_stag = 0;  // from ACCEPT, or our own (multicast)
  std::vector<uint8_t> announcement;
  int64_t next_announce_ns = 0;
  bool terminated = false;  // a TERMINATE was received or sent
  std::string last_error;   // of a failed call: what abort_session() tells the receiver
  bool finished = false;    // FIN_ACK received
  int64_t next_poll_ns = 0;

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

  // The receiver ended the session on a protocol error of ours (engine/dgram/wire/control.h): every later call fails
  // with its reason.
  void on_terminate(std::span<const uint8_t> p) {
    auto t = decode_terminate(p);
    if (!t || terminated) return;
    terminated = true;
    link->abort(
        {Code::kProtocolError, "the receiver at " + link->peer().str() + " terminated the session: " + describe(*t)});
  }

  // Without TERMINATE, a sender that stops early tells the receiver why (it would wait for a FIN until
  // its session timeout otherwise). Best effort.
  void abort_session(const std::string& why) {
    if (terminated || finished || !handshake || !handshake->accepted()) return;
    terminated = true;
    (void)link->send_terminate({TerminateLayer::kRdmap, TerminateCode::kAborted, why});
  }

  Status noted(Status st) {
    if (!st.is_ok() && last_error.empty()) last_error = st.message();
    return st;
  }

  // UD and RC sends never wait for the receiver: look for a TERMINATE now and then (RD does with its acks).
  Status poll_unsequenced() {
    if (proto->sequenced || multicast) return Status::ok();
    const int64_t now = now_ns();
    if (now < next_poll_ns) return Status::ok();
    next_poll_ns = now + kPollInterval;
    return link->progress(0);
  }

  // A datagram from the receiver: its MAC (once the session has keys), RD's ack, a control message.
  void on_segment(std::span<const std::byte> d) {
    auto seg = decode_segment(d);
    if (!seg) return;  // damaged or foreign: the receiver repeats what matters
    const SegmentHeader& h = seg->header;
    const std::optional<ControlType> type = control_type_of(*seg);
    if (SegmentMac* mac = handshake->rx_mac(); mac && !mac->verify(*seg)) {
      // A late copy of the handshake's own answers is unsigned; anything else is forged.
      if (type != ControlType::kAccept && type != ControlType::kChallenge && type != ControlType::kRefuse) {
        ++stats.forged;
      }
      return;
    }
    if (h.opcode == Opcode::kTerminate) return on_terminate(as_u8(seg->payload));
    link->on_ack(h);
    if (!type) return;
    if (*type == ControlType::kFinAck) return on_fin_ack(as_u8(seg->payload));
    handshake->on_control(*type, as_u8(seg->payload));
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
    if (multicast) SLOTSTREAM_RETURN_IF_ERROR(announce(1));
    const MessageSlot slot{device, dev.index, dev.next_msn++, o.ring, first_stag, m.size()};
    SLOTSTREAM_RETURN_IF_ERROR(send_segments(slot, m));
    SLOTSTREAM_RETURN_IF_ERROR(link->end_message());
    SLOTSTREAM_RETURN_IF_ERROR(poll_unsequenced());
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

  // A multicast session (engine/dgram/wire/control.h ANNOUNCE): its ANNOUNCE `copies` times now and then every
  // kAnnounceInterval, in place of the handshake no group can answer.
  Status announce(int copies) {
    const int64_t now = now_ns();
    if (now < next_announce_ns) return Status::ok();
    next_announce_ns = now + kAnnounceInterval;
    for (int i = 0; i < copies; ++i) SLOTSTREAM_RETURN_IF_ERROR(link->send_control(announcement));
    return Status::ok();
  }

  Status start_multicast(const HandshakeOptions& ho) {
    if (!o.token.empty()) {
      return {Code::kInvalidArgument,
              "a multicast group has no handshake, so no token can be proved (--token-file): leave it out, or send "
              "to one receiver"};
    }
    multicast = true;
    first_stag = 1;
    announcement = encode_control(Announce{first_stag, hello_of(ho, *proto)});
    return announce(kFirstAnnounces);
  }

  // The end of a multicast session: FIN parts, kMulticastFins times, answered by no one (each receiver
  // accounts on its own).
  Status finish_multicast() {
    const auto parts = fin_parts();
    for (int round = 0; round < kMulticastFins; ++round) {
      for (const auto& part : parts) SLOTSTREAM_RETURN_IF_ERROR(link->send_control(part));
      SLOTSTREAM_RETURN_IF_ERROR(link->progress(int(kFinInterval / kMs / 4)));
    }
    finished = true;
    return Status::ok();
  }

  Status finish(FinAck* report) {
    SLOTSTREAM_RETURN_IF_ERROR(link->flush());
    if (multicast) {
      if (report) *report = FinAck{uint16_t(o.devices.size()), 0, {}};
      return finish_multicast();
    }
    if (proto->sequenced) {
      while (!link->all_acked()) SLOTSTREAM_RETURN_IF_ERROR(progress(5));
    }
    SLOTSTREAM_RETURN_IF_ERROR(exchange_fin());
    finished = true;
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
DatagramSender::~DatagramSender() {
  std::lock_guard lock(impl_->mu);
  impl_->abort_session("the sender stopped before the end of its stream" +
                       (impl_->last_error.empty() ? std::string() : ": " + impl_->last_error));
}

Status DatagramSender::validate(const DatagramSenderOptions& o) { return check_options(o, find_protocol(o.protocol)); }

Status DatagramSender::connect(const DatagramSenderOptions& o, std::unique_ptr<DatagramSender>* out) {
  auto impl = std::make_unique<Impl>();
  impl->o = o;
  impl->proto = find_protocol(o.protocol);
  SLOTSTREAM_RETURN_IF_ERROR(check_options(o, impl->proto));
  for (size_t i = 0; i < o.devices.size(); ++i) {
    impl->devices[o.devices[i]].index = i;  // none twice: check_options
  }
  LinkOptions lo{o.host, o.port, o.socket_buffer, o.inject, o.handshake_timeout_ns, o.ttl, o.interface};
  SLOTSTREAM_RETURN_IF_ERROR(SenderLink::open(*impl->proto, lo, &impl->link));
  Impl* im = impl.get();
  im->link->set_receiver([im](std::span<const std::byte> d) { im->on_segment(d); });
  HandshakeOptions ho{o.name, o.devices, o.ring, o.max_message, o.segment_size, o.token, o.handshake_timeout_ns};
  im->handshake = std::make_unique<SenderHandshake>(ho, *im->proto, *im->link);
  if (im->link->multicast()) {
    SLOTSTREAM_RETURN_IF_ERROR(im->start_multicast(ho));
    out->reset(new DatagramSender(std::move(impl)));
    return Status::ok();
  }
  if (Status st = im->handshake->run(); !st.is_ok()) {
    // An ACCEPT this sender cannot honour: the receiver has a session for it; tell it why it ends.
    if (im->handshake->accepted() && !im->terminated) {
      im->terminated = true;
      (void)im->link->send_terminate({TerminateLayer::kRdmap, TerminateCode::kHandshake, st.message()});
    }
    return st;
  }
  im->first_stag = im->handshake->first_stag();
  out->reset(new DatagramSender(std::move(impl)));
  return Status::ok();
}

Status DatagramSender::send(uint16_t device, std::span<const std::byte> message) {
  std::lock_guard lock(impl_->mu);
  return impl_->noted(peer_named(impl_->send_message(device, message), impl_->link->peer()));
}

Status DatagramSender::send_with(uint16_t device, uint64_t length, const FillFn& fill) {
  // Not zero-filled first: `fill` writes every byte (a 50 MB file would otherwise be written twice).
  auto buf = std::make_unique_for_overwrite<std::byte[]>(length);
  const std::span<std::byte> message(buf.get(), length);
  SLOTSTREAM_RETURN_IF_ERROR(fill(0, message));
  std::lock_guard lock(impl_->mu);
  return impl_->noted(peer_named(impl_->send_message(device, message), impl_->link->peer()));
}

Status DatagramSender::finish(FinAck* report) {
  std::lock_guard lock(impl_->mu);
  return impl_->noted(peer_named(impl_->finish(report), impl_->link->peer()));
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
bool DatagramSender::multicast() const { return impl_->multicast; }
uint32_t DatagramSender::segment_size() const { return impl_->o.segment_size; }

}  // namespace slotstream::dgram
