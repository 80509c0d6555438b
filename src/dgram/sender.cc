#include "dgram/sender.h"

#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <mutex>
#include <optional>
#include <random>

#include "dgram/auth.h"
#include "dgram/llp.h"
#include "dgram/mac.h"
#include "dgram/protocols.h"
#include "dgram/rd.h"
#include "dgram/wire.h"
#include "net/auth.h"
#include "wire/codec.h"

namespace slotstream::dgram {
namespace {

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kHelloInterval = 100 * kMs;
constexpr int64_t kFinInterval = 200 * kMs;
// RC: write queued segments out once this much is waiting (and at the end of every message).
constexpr size_t kTcpFlushBytes = 1u << 20;

uint32_t random_qp() {
  std::random_device rd;
  uint32_t v = 0;
  while (v == 0) v = rd();
  return v;
}

std::span<const uint8_t> as_u8(std::span<const std::byte> s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}
std::span<const std::byte> as_bytes(const std::vector<uint8_t>& v) {
  return {reinterpret_cast<const std::byte*>(v.data()), v.size()};
}

Status tcp_connect(const Address& peer, int64_t timeout_ns, Fd* out) {
  Fd fd(::socket(peer.ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return {Code::kConnectFailed, std::string("socket: ") + strerror(errno)};
  int one = 1;
  setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&peer.ss), peer.len) != 0 && errno != EINPROGRESS) {
    return {Code::kConnectFailed, "cannot connect to " + peer.str() + " (tcp): " + strerror(errno)};
  }
  pollfd p{fd.get(), POLLOUT, 0};
  if (poll(&p, 1, int(timeout_ns / kMs)) <= 0) {
    return {Code::kConnectFailed, "cannot connect to " + peer.str() + " (tcp): timed out"};
  }
  int err = 0;
  socklen_t len = sizeof err;
  getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
  if (err != 0) return {Code::kConnectFailed, "cannot connect to " + peer.str() + " (tcp): " + strerror(err)};
  *out = std::move(fd);
  return Status::ok();
}

}  // namespace

struct DatagramSender::Impl {
  SenderOptions o;
  const Protocol* proto = nullptr;
  mutable std::mutex mu;
  Address peer;
  uint32_t qp = random_qp();

  // UD and RD
  std::unique_ptr<UdpSocket> udp;
  UdpSocket::Batch batch;
  UdpSocket::Inbox inbox{16};
  std::optional<FaultyLink> faults;
  RdSender rd;
  // RC
  std::unique_ptr<FramedStream> tcp;

  // The handshake.
  DgramNonce nonce{};
  std::vector<uint8_t> hello_bytes;  // the HELLO as sent (AUTH's proof covers it)
  std::optional<Challenge> challenge;
  std::unique_ptr<SegmentMac> tx_mac, rx_mac;  // with a token, from ACCEPT on
  // From ACCEPT.
  bool accepted = false;
  std::optional<std::string> refused;
  std::optional<std::string> auth_error;
  uint64_t region_length = 0;
  uint32_t first_stag = 0;

  struct Device {
    size_t index = 0;  // in the HELLO's list: its STags are first_stag + index * ring ...
    uint32_t next_msn = 0;
    uint64_t bytes = 0;
  };
  std::map<uint16_t, Device> devices;
  uint32_t control_msn = 0;
  std::map<uint16_t, FinAck> fin_acks;  // FIN_ACK parts received, by their first device
  SenderStats stats;
  std::vector<std::byte> scratch;

  Service service() const { return proto->over_tcp() ? Service::kRC : proto->service; }
  // Control messages travel unsequenced over UDP (repeated until answered), in-band over TCP.
  Service control_service() const { return proto->over_tcp() ? Service::kRC : Service::kUD; }

  Status put_datagram(std::span<const std::byte> d) {
    ++stats.datagrams;
    auto add = [&](std::span<const std::byte> x, bool) {
      auto dst = batch.add(x.size());
      std::memcpy(dst.data(), x.data(), x.size());
    };
    if (faults) {
      faults->pass(d, add);
    } else {
      add(d, false);
    }
    if (batch.full()) return udp->send(batch);
    return Status::ok();
  }

  Status flush() {
    if (tcp) return tcp->flush();
    if (faults && !rd_active())
      faults->flush([&](std::span<const std::byte> x, bool) {
        auto dst = batch.add(x.size());
        std::memcpy(dst.data(), x.data(), x.size());
      });
    if (batch.size() == 0) return Status::ok();
    return udp->send(batch);
  }

  bool rd_active() const { return proto->service == Service::kRD; }

  // The segment into `scratch`, signed once the session has keys.
  void encode(const SegmentHeader& h, std::span<const std::byte> payload) {
    scratch.resize(header_size(h) + payload.size() + kMaxTrailerSize);
    scratch.resize(encode_segment(h, payload, scratch, tx_mac.get()));
  }

  Status emit(SegmentHeader h, std::span<const std::byte> payload) {
    h.source_qp = qp;
    if (tcp) {
      encode(h, payload);
      tcp->queue(scratch);
      ++stats.datagrams;
      return tcp->pending() >= kTcpFlushBytes ? tcp->flush() : Status::ok();
    }
    if (h.service == Service::kRD) {
      SLOTSTREAM_RETURN_IF_ERROR(wait_credit());
      h.rd = RdFields{rd.next_seq(), 0, 0, kRdSeqValid, 0};
      std::vector<std::byte> d(header_size(h) + payload.size() + kMaxTrailerSize);
      d.resize(encode_segment(h, payload, d, tx_mac.get()));
      SLOTSTREAM_RETURN_IF_ERROR(put_datagram(d));
      rd.sent(std::move(d), now_ns());
      return Status::ok();
    }
    if (!faults) {
      // The common case: encode straight into the batch.
      auto dst = batch.add(header_size(h) + payload.size() + kMaxTrailerSize);
      batch.shrink_last(encode_segment(h, payload, dst, tx_mac.get()));
      ++stats.datagrams;
      return batch.full() ? udp->send(batch) : Status::ok();
    }
    encode(h, payload);
    return put_datagram(scratch);
  }

  Status wait_credit() {
    if (rd.window_open()) return Status::ok();
    ++stats.credit_waits;
    SLOTSTREAM_RETURN_IF_ERROR(flush());
    while (!rd.window_open()) {
      SLOTSTREAM_RETURN_IF_ERROR(progress(1));
    }
    return Status::ok();
  }

  Status send_control(const std::vector<uint8_t>& payload) {
    SegmentHeader h;
    h.service = control_service();
    h.opcode = Opcode::kSend;
    h.queue = kControlQueue;
    h.msn = control_msn++;
    h.last = true;
    if (tcp) {
      SLOTSTREAM_RETURN_IF_ERROR(emit(h, as_bytes(payload)));
      return tcp->flush();
    }
    h.source_qp = qp;
    encode(h, as_bytes(payload));
    SLOTSTREAM_RETURN_IF_ERROR(put_datagram(scratch));
    return flush();
  }

  void on_accept(std::span<const uint8_t> p) {
    auto a = decode_accept(p);
    if (!a || accepted) return;
    if (!o.token.empty()) {
      const Proof want = accept_proof(o.token, challenge ? challenge->nonce : DgramNonce{}, nonce, hello_bytes, *a);
      if (!challenge || !proof_equal(a->proof, want)) {
        auth_error = "the receiver at " + peer.str() +
                     " did not prove that it has the token: a different token, or not the receiver you meant";
        return;
      }
      const SessionKeys keys = session_keys(o.token, challenge->nonce, nonce);
      tx_mac = std::make_unique<SegmentMac>(keys.to_receiver);
      rx_mac = std::make_unique<SegmentMac>(keys.to_sender);
    }
    accepted = true;
    region_length = a->region_length;
    first_stag = a->first_stag;
    if (a->devices != o.devices.size()) auth_error = "the receiver's ACCEPT does not match this sender's devices";
  }

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

  void on_control(std::span<const std::byte> payload) {
    auto p = as_u8(payload);
    switch (control_type(p).value_or(ControlType::kHello)) {
      case ControlType::kChallenge:
        if (auto c = decode_challenge(p); c && !accepted) {
          if (o.token.empty()) {
            auth_error = "the receiver at " + peer.str() + " requires authentication: give its token (--token-file)";
          } else if (!challenge) {
            challenge = *c;
          }
        }
        break;
      case ControlType::kAccept:
        on_accept(p);
        break;
      case ControlType::kRefuse:
        // Only an answer to our HELLO or AUTH: once accepted, an unsigned REFUSE is no one's word.
        if (auto r = decode_refuse(p); r && !accepted) refused = r->reason;
        break;
      case ControlType::kFinAck:
        on_fin_ack(p);
        break;
      default:
        break;  // a sender is never sent anything else; ignore
    }
  }

  void on_segment(std::span<const std::byte> d) {
    auto seg = decode_segment(d);
    if (!seg) return;  // damaged or foreign: the receiver repeats what matters
    const SegmentHeader& h = seg->header;
    const bool control = h.opcode == Opcode::kSend && h.queue == kControlQueue;
    if (rx_mac && !rx_mac->verify(*seg)) {
      // A late copy of the handshake's own answers is unsigned; anything else is forged.
      const auto type = control ? control_type(as_u8(seg->payload)) : std::nullopt;
      if (type != ControlType::kAccept && type != ControlType::kChallenge && type != ControlType::kRefuse) {
        ++stats.forged;
      }
      return;
    }
    if (h.service == Service::kRD && (h.rd.flags & kRdAckValid)) {
      rd.on_ack(h.rd.ack, h.rd.credits, h.rd.sack, now_ns());
    }
    if (control) on_control(seg->payload);
  }

  // Waits up to timeout_ms for input, handles it, and (RD) retransmits what is due.
  Status progress(int timeout_ms) {
    if (tcp) {
      pollfd p{tcp->fd(), POLLIN, 0};
      if (poll(&p, 1, timeout_ms) > 0) {
        Status st = tcp->read_available();
        std::span<const std::byte> f;
        while (tcp->next_frame(&f)) on_segment(f);
        // A REFUSE (or a failed proof) comes just before the receiver closes: that is the news, not the close.
        if (!st.is_ok() && !all_fin_acked() && !refused && !auth_error) {
          return {Code::kPeerGone, "receiver closed the connection: " + st.message()};
        }
      }
      return Status::ok();
    }
    pollfd p{udp->fd(), POLLIN, 0};
    int64_t wait = timeout_ms;
    if (rd_active() && !rd.all_acked()) {
      wait = std::min<int64_t>(wait, std::max<int64_t>(0, (rd.next_timer_ns() - now_ns()) / kMs));
    }
    if (poll(&p, 1, int(wait)) > 0) {
      for (;;) {
        Status st = udp->receive(inbox);
        if (!st.is_ok()) {
          return {st.code(), "receiver at " + peer.str() + " is gone: " + st.message()};
        }
        if (inbox.size() == 0) break;
        for (size_t i = 0; i < inbox.size(); ++i) on_segment(inbox.datagram(i));
      }
    }
    if (rd_active()) {
      const int64_t now = now_ns();
      if (rd.failed(now)) {
        return {Code::kPeerGone, "receiver at " + peer.str() + " acknowledged nothing for 10 s"};
      }
      std::vector<const std::vector<std::byte>*> again;
      rd.due(now, &again);
      for (const auto* d : again) SLOTSTREAM_RETURN_IF_ERROR(put_datagram(*d));
      if (rd.wants_probe(now)) {
        SegmentHeader h;
        h.service = Service::kRD;
        h.opcode = Opcode::kAck;
        h.source_qp = qp;
        h.rd.flags = kRdProbe;
        std::byte buf[kMaxHeaderSize + kMaxTrailerSize];
        SLOTSTREAM_RETURN_IF_ERROR(put_datagram(std::span(buf, encode_segment(h, {}, buf, tx_mac.get()))));
      }
      SLOTSTREAM_RETURN_IF_ERROR(flush());
    }
    return Status::ok();
  }

  Status make_hello() {
    Hello hello;
    hello.flags = o.token.empty() ? 0 : kHelloAuth;
    hello.protocol = proto->name;
    hello.name = o.name;
    hello.ring = o.ring;
    hello.max_message = o.max_message;
    hello.segment_size = o.segment_size;
    hello.devices = o.devices;
    net::Nonce n;
    SLOTSTREAM_RETURN_IF_ERROR(net::make_nonce(&n));
    static_assert(sizeof(n) == sizeof(nonce));
    std::copy(n.begin(), n.end(), nonce.begin());
    hello.nonce = nonce;
    // Padded, so that the receiver may answer it before knowing who we are (dgram/control.h).
    const size_t bare = encode_control(hello).size();
    hello.padding = uint16_t(bare < kHelloPaddedSize ? kHelloPaddedSize - bare : 0);
    hello_bytes = encode_control(hello);
    return Status::ok();
  }

  // HELLO, or AUTH once the receiver has challenged us.
  std::vector<uint8_t> handshake_request() const {
    if (!challenge) return hello_bytes;
    Auth a;
    a.receiver_nonce = challenge->nonce;
    a.hello = hello_bytes;
    a.proof = hello_proof(o.token, challenge->nonce, nonce, hello_bytes);
    return encode_control(a);
  }

  Status handshake_failed(const Status& st, const std::string& where) const {
    if (st.code() == Code::kPeerGone && !tcp) {
      return {Code::kConnectFailed, "nothing listens at " + where +
                                        " (port unreachable): is `slotstream recv --transport udp` running there?"};
    }
    return {Code::kConnectFailed, "no receiver at " + where + ": " + st.message()};
  }

  Status handshake() {
    SLOTSTREAM_RETURN_IF_ERROR(make_hello());
    const int64_t deadline = now_ns() + o.handshake_timeout_ns;
    const std::string where = peer.str() + (tcp ? " (tcp)" : " (udp)");
    bool sent_auth = false;
    int64_t next_send = 0;
    while (!accepted && !refused && !auth_error) {
      const int64_t now = now_ns();
      if (now >= deadline) {
        return {Code::kConnectFailed, "no slotstream datagram receiver answered at " + where + " within " +
                                          std::to_string(o.handshake_timeout_ns / 1'000'000'000) + " s"};
      }
      // Over UDP repeated (a datagram may be lost); over TCP once per step.
      const bool first_auth = challenge && !sent_auth;
      if (tcp ? (next_send == 0 || first_auth) : (now >= next_send || first_auth)) {
        if (Status st = send_control(handshake_request()); !st.is_ok()) return handshake_failed(st, where);
        sent_auth = challenge.has_value();
        next_send = now + kHelloInterval;
      }
      Status st = progress(int(std::max<int64_t>(1, std::min(deadline, next_send) - now_ns()) / kMs));
      if (!st.is_ok()) return handshake_failed(st, where);
    }
    if (auth_error) return {Code::kAuthFailed, *auth_error};
    if (refused) return {Code::kRefused, "receiver refused: " + *refused};
    if (region_length < o.max_message && proto->data_op != Opcode::kSend) {
      return {Code::kProtocolError,
              "receiver's regions (" + std::to_string(region_length) + " B) are smaller than the largest message"};
    }
    return Status::ok();
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
    const uint32_t msn = dev.next_msn++;
    const uint32_t seg = o.segment_size;
    SegmentHeader h;
    h.service = service();
    h.opcode = proto->data_op;
    uint32_t stag = 0;
    if (proto->data_op == Opcode::kSend) {
      h.queue = device;
      h.msn = msn;
    } else {
      stag = first_stag + uint32_t(dev.index * o.ring + msn % o.ring);
      h.stag = stag;
      h.has_msn = proto->data_op == Opcode::kWriteRecord;
      h.msn = h.has_msn ? msn : 0;
    }
    uint64_t off = 0;
    do {
      const size_t n = std::min<uint64_t>(seg, m.size() - off);
      h.offset = off;
      // A plain RDMA Write has no L that means anything to the target: its Send does.
      h.last = off + n == m.size();
      SLOTSTREAM_RETURN_IF_ERROR(emit(h, m.subspan(off, n)));
      off += n;
    } while (off < m.size());
    if (proto->data_op == Opcode::kWrite) {
      // The notification: "completing a send/recv operation after the successful RDMA Write".
      std::byte note[12];
      wire::put_le(note, stag, 4);
      wire::put_le(note + 4, m.size(), 8);
      SegmentHeader n;
      n.service = Service::kRC;
      n.opcode = Opcode::kSend;
      n.queue = device;
      n.msn = msn;
      n.last = true;
      SLOTSTREAM_RETURN_IF_ERROR(emit(n, note));
    }
    if (!tcp || tcp->has_output()) SLOTSTREAM_RETURN_IF_ERROR(flush());
    ++stats.messages;
    stats.bytes += m.size();
    ++stats.per_device[device];
    dev.bytes += m.size();
    // Acknowledgements arrive while we send; take them now and then so the window keeps moving.
    if (rd_active()) SLOTSTREAM_RETURN_IF_ERROR(progress(0));
    return Status::ok();
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

  Status finish(FinAck* report) {
    SLOTSTREAM_RETURN_IF_ERROR(flush());
    if (rd_active()) {
      while (!rd.all_acked()) SLOTSTREAM_RETURN_IF_ERROR(progress(5));
    }
    const auto parts = fin_parts();
    const int64_t deadline = now_ns() + o.finish_timeout_ns;
    int64_t next_fin = 0;
    while (!all_fin_acked()) {
      const int64_t now = now_ns();
      if (now >= deadline) {
        return {Code::kTimeout, "the receiver at " + peer.str() + " did not confirm the end of the stream within " +
                                    std::to_string(o.finish_timeout_ns / 1'000'000'000) + " s"};
      }
      if (now >= next_fin && (!tcp || next_fin == 0)) {
        // Over UDP the parts not yet answered, again and again; over TCP each once.
        for (size_t i = 0; i < parts.size(); ++i) {
          if (!fin_acks.contains(uint16_t(i * kFinPartDevices))) SLOTSTREAM_RETURN_IF_ERROR(send_control(parts[i]));
        }
        next_fin = now + kFinInterval;
      }
      SLOTSTREAM_RETURN_IF_ERROR(progress(20));
    }
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

Status DatagramSender::connect(const SenderOptions& o, std::unique_ptr<DatagramSender>* out) {
  auto impl = std::make_unique<Impl>();
  impl->o = o;
  impl->proto = find_protocol(o.protocol);
  if (!impl->proto) return {Code::kInvalidArgument, "unknown datagram protocol '" + o.protocol + "'"};
  if (o.devices.empty()) return {Code::kInvalidArgument, "no devices"};
  if (o.ring == 0 || o.ring > 1024) return {Code::kInvalidArgument, "ring (STags per device) must be 1..1024"};
  if (o.segment_size < 64 || o.segment_size > kMaxSegmentPayload) {
    return {Code::kInvalidArgument,
            "segment size must be 64.." + std::to_string(kMaxSegmentPayload) + " B (one UDP datagram with headers)"};
  }
  if (o.inject.any() && impl->proto->over_tcp()) {
    return {Code::kInvalidArgument,
            "fault injection applies to datagrams; dgram_rc runs over TCP "
            "(use an nftables rule for real loss on both)"};
  }
  if (o.devices.size() > kMaxHelloDevices) {
    return {Code::kInvalidArgument, "at most " + std::to_string(kMaxHelloDevices) + " devices per datagram sender"};
  }
  for (size_t i = 0; i < o.devices.size(); ++i) {
    auto [it, fresh] = impl->devices.try_emplace(o.devices[i]);
    if (!fresh) return {Code::kInvalidArgument, "device " + std::to_string(o.devices[i]) + " is listed twice"};
    it->second.index = i;
  }
  SLOTSTREAM_RETURN_IF_ERROR(resolve(o.host, o.port, &impl->peer));
  if (impl->proto->over_tcp()) {
    Fd fd;
    SLOTSTREAM_RETURN_IF_ERROR(tcp_connect(impl->peer, o.handshake_timeout_ns, &fd));
    impl->tcp = std::make_unique<FramedStream>(std::move(fd));
  } else {
    const char* any = impl->peer.ss.ss_family == AF_INET6 ? "::" : "0.0.0.0";
    SLOTSTREAM_RETURN_IF_ERROR(UdpSocket::open(any, 0, o.socket_buffer, &impl->udp));
    SLOTSTREAM_RETURN_IF_ERROR(impl->udp->connect(impl->peer));
    if (o.inject.any()) impl->faults.emplace(o.inject);
  }
  SLOTSTREAM_RETURN_IF_ERROR(impl->handshake());
  out->reset(new DatagramSender(std::move(impl)));
  return Status::ok();
}

namespace {

// A lower layer's "port unreachable" names the socket call; the user wants to know who is gone.
Status peer_named(Status st, const Address& peer) {
  if (st.code() != Code::kPeerGone || st.message().starts_with("receiver")) return st;
  return {Code::kPeerGone, "the receiver at " + peer.str() + " is gone (" + st.message() + ")"};
}

}  // namespace

Status DatagramSender::send(uint16_t device, std::span<const std::byte> message) {
  std::lock_guard lock(impl_->mu);
  return peer_named(impl_->send_message(device, message), impl_->peer);
}

Status DatagramSender::send_with(uint16_t device, uint64_t length, const FillFn& fill) {
  // Not zero-filled first: `fill` writes every byte (a 50 MB file would otherwise be written twice).
  auto buf = std::make_unique_for_overwrite<std::byte[]>(length);
  const std::span<std::byte> message(buf.get(), length);
  SLOTSTREAM_RETURN_IF_ERROR(fill(0, message));
  std::lock_guard lock(impl_->mu);
  return peer_named(impl_->send_message(device, message), impl_->peer);
}

Status DatagramSender::finish(FinAck* report) {
  std::lock_guard lock(impl_->mu);
  return peer_named(impl_->finish(report), impl_->peer);
}

SenderStats DatagramSender::stats() const {
  std::lock_guard lock(impl_->mu);
  SenderStats s = impl_->stats;
  s.retransmits = impl_->rd.stats().retransmits;
  s.timeouts = impl_->rd.stats().timeouts;
  if (impl_->faults) {
    const auto& f = impl_->faults->stats();
    s.injected_loss = f.dropped;
    s.injected_corrupt = f.corrupted;
    s.injected_duplicate = f.duplicated;
    s.injected_reorder = f.reordered;
  }
  return s;
}

const std::string& DatagramSender::protocol() const { return impl_->o.protocol; }
uint32_t DatagramSender::segment_size() const { return impl_->o.segment_size; }

}  // namespace slotstream::dgram
