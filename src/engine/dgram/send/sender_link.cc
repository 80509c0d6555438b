#include "engine/dgram/send/sender_link.h"

#include <netinet/tcp.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>

#include "clock.h"
#include "engine/dgram/wire/control.h"
#include "engine/dgram/wire/mac.h"

namespace slotstream::dgram {
namespace {

constexpr int64_t kMs = 1'000'000;
// RC: write queued segments out once this much is waiting (and at the end of every message).
constexpr size_t kTcpFlushBytes = 1u << 20;

uint32_t random_qp() {
  std::random_device rd;
  uint32_t v = 0;
  while (v == 0) v = rd();
  return v;
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

std::span<const std::byte> as_bytes(std::span<const uint8_t> v) {
  return {reinterpret_cast<const std::byte*>(v.data()), v.size()};
}

}  // namespace

Status SenderLink::open(const Descriptor& proto, const LinkOptions& o, std::unique_ptr<SenderLink>* out) {
  std::unique_ptr<SenderLink> l(new SenderLink(proto));
  l->qp_ = random_qp();
  SLOTSTREAM_RETURN_IF_ERROR(resolve(o.host, o.port, &l->peer_));
  if (is_multicast(l->peer_) && proto.reliable) {
    return {
        Code::kInvalidArgument,
        l->peer_.str() + " is a multicast group: it cannot acknowledge datagrams, so " + std::string(proto.name) +
            " (reliable) cannot send to it; use a UD protocol (write_record, dgram_send) or one receiver's address"};
  }
  if (proto.over_tcp) {
    Fd fd;
    SLOTSTREAM_RETURN_IF_ERROR(tcp_connect(l->peer_, o.connect_timeout_ns, &fd));
    l->tcp_ = std::make_unique<FramedStream>(std::move(fd));
  } else {
    SLOTSTREAM_RETURN_IF_ERROR(l->open_udp(o));
  }
  *out = std::move(l);
  return Status::ok();
}

// A UDP socket connected to the receiver, or to a multicast group with the group's options.
Status SenderLink::open_udp(const LinkOptions& o) {
  multicast_ = is_multicast(peer_);
  if (!multicast_ && (o.ttl != 0 || !o.interface.empty())) {
    return {Code::kInvalidArgument,
            "--ttl and --interface apply to a multicast group (--to 239.x.y.z:PORT); " + peer_.str() + " is not one"};
  }
  const char* any = peer_.ss.ss_family == AF_INET6 ? "::" : "0.0.0.0";
  SLOTSTREAM_RETURN_IF_ERROR(UdpSocket::open(any, 0, o.socket_buffer, &udp_));
  if (multicast_) SLOTSTREAM_RETURN_IF_ERROR(udp_->set_multicast(o.ttl == 0 ? 1 : o.ttl, o.interface));
  SLOTSTREAM_RETURN_IF_ERROR(udp_->connect(peer_));
  if (o.inject.any()) faults_.emplace(o.inject);
  return Status::ok();
}

// ------------------------------------------------------------------ sending

void SenderLink::encode(const SegmentHeader& h, std::span<const std::byte> payload) {
  scratch_.resize(header_size(h) + payload.size() + kMaxTrailerSize);
  scratch_.resize(encode_segment(h, payload, scratch_, mac_));
}

void SenderLink::batch_add(std::span<const std::byte> d) {
  auto dst = batch_.add(d.size());
  std::memcpy(dst.data(), d.data(), d.size());
}

Status SenderLink::put_datagram(std::span<const std::byte> d) {
  ++stats_.datagrams;
  if (faults_) {
    faults_->pass(d, [&](std::span<const std::byte> x, bool) { batch_add(x); });
  } else {
    batch_add(d);
  }
  if (batch_.full()) return udp_->send(batch_);
  return Status::ok();
}

Status SenderLink::flush() {
  if (tcp_) return tcp_->flush();
  if (faults_ && !proto_.sequenced) faults_->flush([&](std::span<const std::byte> x, bool) { batch_add(x); });
  if (batch_.size() == 0) return Status::ok();
  return udp_->send(batch_);
}

Status SenderLink::emit(SegmentHeader h, std::span<const std::byte> payload) {
  if (!aborted_.is_ok()) return aborted_;
  h.source_qp = qp_;
  if (tcp_) return emit_tcp(h, payload);
  if (h.service == Service::kRD) return emit_rd(h, payload);
  if (!faults_) {
    // The common case: encode straight into the batch.
    auto dst = batch_.add(header_size(h) + payload.size() + kMaxTrailerSize);
    batch_.shrink_last(encode_segment(h, payload, dst, mac_));
    ++stats_.datagrams;
    return batch_.full() ? udp_->send(batch_) : Status::ok();
  }
  encode(h, payload);
  return put_datagram(scratch_);
}

Status SenderLink::emit_tcp(const SegmentHeader& h, std::span<const std::byte> payload) {
  encode(h, payload);
  tcp_->queue(scratch_);
  ++stats_.datagrams;
  return tcp_->pending() >= kTcpFlushBytes ? tcp_->flush() : Status::ok();
}

Status SenderLink::emit_rd(SegmentHeader h, std::span<const std::byte> payload) {
  SLOTSTREAM_RETURN_IF_ERROR(wait_credit());
  h.rd = RdFields{rd_.next_seq(), 0, 0, kRdSeqValid, 0};
  std::vector<std::byte> d(header_size(h) + payload.size() + kMaxTrailerSize);
  d.resize(encode_segment(h, payload, d, mac_));
  SLOTSTREAM_RETURN_IF_ERROR(put_datagram(d));
  rd_.sent(std::move(d), now_ns());
  return Status::ok();
}

Status SenderLink::wait_credit() {
  if (rd_.window_open()) return Status::ok();
  ++stats_.credit_waits;
  SLOTSTREAM_RETURN_IF_ERROR(flush());
  while (!rd_.window_open()) {
    SLOTSTREAM_RETURN_IF_ERROR(progress(1));
  }
  return Status::ok();
}

Status SenderLink::send_control(std::span<const uint8_t> payload) {
  SegmentHeader h;
  h.service = tcp_ ? Service::kRC : Service::kUD;
  h.opcode = Opcode::kSend;
  h.queue = kControlQueue;
  h.msn = control_msn_++;
  h.last = true;
  h.source_qp = qp_;
  if (tcp_) {
    SLOTSTREAM_RETURN_IF_ERROR(emit_tcp(h, as_bytes(payload)));
    return tcp_->flush();
  }
  encode(h, as_bytes(payload));
  SLOTSTREAM_RETURN_IF_ERROR(put_datagram(scratch_));
  return flush();
}

Status SenderLink::send_terminate(const Terminate& t) {
  SegmentHeader h = terminate_header(tcp_ != nullptr, terminate_msn_++);
  h.source_qp = qp_;
  const std::vector<uint8_t> payload = encode_terminate(t);
  if (tcp_) {
    SLOTSTREAM_RETURN_IF_ERROR(emit_tcp(h, as_bytes(payload)));
    return tcp_->flush();
  }
  encode(h, as_bytes(payload));
  batch_add(scratch_);  // not through the fault injector: the session ends either way
  ++stats_.datagrams;
  return flush();
}

Status SenderLink::end_message() {
  if (!tcp_ || tcp_->has_output()) SLOTSTREAM_RETURN_IF_ERROR(flush());
  // Acknowledgements arrive while we send; take them now and then so the window keeps moving.
  if (proto_.sequenced) return progress(0);
  return Status::ok();
}

// ------------------------------------------------------------------ receiving

void SenderLink::on_ack(const SegmentHeader& h) {
  if (h.service == Service::kRD && (h.rd.flags & kRdAckValid)) rd_.on_ack(h.rd.ack, h.rd.credits, h.rd.sack, now_ns());
}

Status SenderLink::progress(int timeout_ms) {
  if (!aborted_.is_ok()) return aborted_;
  Status st = tcp_ ? receive_tcp(timeout_ms) : receive_udp(timeout_ms);
  // A TERMINATE that came with this input is the news, not the close (TCP) that follows it.
  if (!aborted_.is_ok()) return aborted_;
  SLOTSTREAM_RETURN_IF_ERROR(st);
  return proto_.sequenced && !tcp_ ? retransmit() : Status::ok();
}

Status SenderLink::receive_tcp(int timeout_ms) {
  pollfd p{tcp_->fd(), POLLIN, 0};
  if (poll(&p, 1, timeout_ms) <= 0) return Status::ok();
  Status st = tcp_->read_available();
  std::span<const std::byte> f;
  while (tcp_->next_frame(&f)) on_datagram_(f);
  if (!st.is_ok()) return {Code::kPeerGone, "receiver closed the connection: " + st.message()};
  return Status::ok();
}

Status SenderLink::receive_udp(int timeout_ms) {
  pollfd p{udp_->fd(), POLLIN, 0};
  int64_t wait = timeout_ms;
  if (proto_.sequenced && !rd_.all_acked()) {
    wait = std::min<int64_t>(wait, std::max<int64_t>(0, (rd_.next_timer_ns() - now_ns()) / kMs));
  }
  if (poll(&p, 1, int(wait)) <= 0) return Status::ok();
  for (;;) {
    Status st = udp_->receive(inbox_);
    if (!st.is_ok()) return {st.code(), "receiver at " + peer_.str() + " is gone: " + st.message()};
    if (inbox_.size() == 0) return Status::ok();
    for (size_t i = 0; i < inbox_.size(); ++i) on_datagram_(inbox_.datagram(i));
  }
}

// RD: what is due again, and a probe when the receiver's window has stayed shut.
Status SenderLink::retransmit() {
  const int64_t now = now_ns();
  if (rd_.failed(now)) return {Code::kPeerGone, "receiver at " + peer_.str() + " acknowledged nothing for 10 s"};
  std::vector<const std::vector<std::byte>*> again;
  rd_.due(now, &again);
  for (const auto* d : again) SLOTSTREAM_RETURN_IF_ERROR(put_datagram(*d));
  if (rd_.wants_probe(now)) {
    SegmentHeader h;
    h.service = Service::kRD;
    h.opcode = Opcode::kAck;
    h.source_qp = qp_;
    h.rd.flags = kRdProbe;
    std::byte buf[kMaxHeaderSize + kMaxTrailerSize];
    SLOTSTREAM_RETURN_IF_ERROR(put_datagram(std::span(buf, encode_segment(h, {}, buf, mac_))));
  }
  return flush();
}

}  // namespace slotstream::dgram
