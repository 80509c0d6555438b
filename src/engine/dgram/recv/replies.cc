#include "engine/dgram/recv/replies.h"

#include "engine/dgram/recv/handshake.h"

namespace slotstream::dgram {
namespace {

std::span<const std::byte> as_bytes(std::span<const uint8_t> v) {
  return {reinterpret_cast<const std::byte*>(v.data()), v.size()};
}

}  // namespace

size_t control_size(size_t payload) { return kCommonSize + kUntaggedSize + payload + kCrcSize; }

std::vector<std::byte> Replies::control_segment(Service service, uint32_t msn, std::span<const uint8_t> payload,
                                                SegmentMac* mac) const {
  SegmentHeader h;
  h.service = service;
  h.opcode = Opcode::kSend;
  h.queue = kControlQueue;
  h.msn = msn;
  h.source_qp = qp_;
  std::vector<std::byte> d(kMaxHeaderSize + payload.size() + kMaxTrailerSize);
  d.resize(encode_segment(h, as_bytes(payload), d, mac));
  return d;
}

void Replies::reply(Peer& p, std::span<const uint8_t> payload, bool sign) {
  if (p.multicast) return;  // a group's sender listens to no one
  const Service service = p.conn ? Service::kRC : Service::kUD;
  net_.send(p.conn, p.addr, control_segment(service, p.control_msn++, payload, sign ? p.tx_mac.get() : nullptr));
}

bool Replies::answer_unauthenticated(Conn* conn, const Address& to, std::span<const uint8_t> payload, size_t request) {
  if (control_size(payload.size()) > request) {
    withhold();
    return false;
  }
  net_.send(conn, to, control_segment(conn ? Service::kRC : Service::kUD, 0, payload));
  return true;
}

void Replies::refuse(Conn* conn, const Address& to, const std::string& name, const std::string& reason,
                     size_t request) {
  ++counters_.hellos_refused;
  log_("refused", "refused sender '" + name.substr(0, 64) + "' from " + to.str() + ": " + reason);
  const size_t room = request > control_size(0) ? request - control_size(0) : 0;
  const auto payload = refuse_within(reason, room);
  if (payload.empty()) {
    withhold();
  } else {
    answer_unauthenticated(conn, to, payload, request);
  }
  if (conn) conn->closed = true;
}

void Replies::send_ack(Peer& p, const RdFields& f) {
  if (p.multicast) return;
  SegmentHeader h;
  h.service = Service::kRD;
  h.opcode = Opcode::kAck;
  h.source_qp = qp_;
  h.rd = f;
  std::byte buf[kMaxHeaderSize + kMaxTrailerSize];
  net_.send_udp(std::span(buf, encode_segment(h, {}, buf, p.tx_mac.get())), p.addr);
}

std::vector<std::byte> Replies::terminate(Peer& p, const Terminate& t) {
  SegmentHeader h = terminate_header(p.conn != nullptr, p.control_msn++);
  h.source_qp = qp_;
  const std::vector<uint8_t> payload = encode_terminate(t);
  std::vector<std::byte> d(kMaxHeaderSize + payload.size() + kMaxTrailerSize);
  d.resize(encode_segment(h, as_bytes(payload), d, p.tx_mac.get()));
  if (!p.multicast) net_.send(p.conn, p.addr, d);
  return d;
}

}  // namespace slotstream::dgram
