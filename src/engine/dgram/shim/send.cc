// The preload shim's send path: an application datagram as one UD Send segment, or, larger than one MTU, one UD
// Write-Record message in MTU-sized segments, each sealed (MAC when keyed, CRC), passed through the fault
// injector, and handed to the kernel in sendmmsg — a large datagram's segments as UDP GSO messages (shim/gso.h)
// where the kernel takes UDP_SEGMENT, one message each where it refuses.
#include <netinet/in.h>
#include <netinet/udp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <span>
#include <vector>

#include "engine/dgram/llp/injector.h"
#include "engine/dgram/protocol/write_record.h"
#include "engine/dgram/shim/gso.h"
#include "engine/dgram/shim/internal.h"
#include "engine/dgram/wire/crc32c.h"
#include "engine/dgram/wire/mac.h"
#include "engine/dgram/wire/segments.h"
#include "engine/dgram/wire/wire.h"

namespace slotstream::dgram::shim {

namespace {

std::mutex g_inject_mu;

Injector& injector() {
  static Injector inj(config().inject);
  return inj;
}

size_t ip_udp_overhead(int family) { return (family == AF_INET6 ? 40 : 20) + 8; }
size_t trailer_bytes() { return (config().keyed ? kMacTagSize : 0) + kCrcSize; }

// The largest payload UDP allows a plain socket: what the application may send through the shim too.
size_t max_payload(int family) { return family == AF_INET6 ? 65527 : kMaxUdpPayload; }

// The largest datagram sent as one UD Send that fits the MTU; larger ones become Write-Record messages.
size_t small_max(int family) {
  return config().mtu - ip_udp_overhead(family) - kCommonSize - kUntaggedSize - trailer_bytes();
}

// A Write-Record segment's payload so that the segment fits the MTU.
size_t segment_max(int family) {
  return config().mtu - ip_udp_overhead(family) - kCommonSize - kTaggedSize - 4 /* MSN */ - trailer_bytes();
}

// ------------------------------------------------------------------ send

// Writes the trailer of a segment (header, then the payload in iov): the MAC when keyed, then the CRC
// over all of it. Returns the MAC's size (0 without a key).
size_t seal(std::span<const std::byte> header, const iovec* iov, size_t iovlen, std::byte* trailer) {
  auto part = [&](size_t i) { return std::span(static_cast<const std::byte*>(iov[i].iov_base), iov[i].iov_len); };
  size_t tag = 0;
  if (SegmentMac* m = mac()) {
    m->start();
    m->add(header);
    for (size_t i = 0; i < iovlen; ++i) m->add(part(i));
    m->finish(std::span<std::byte, kMacTagSize>(trailer, kMacTagSize));
    tag = kMacTagSize;
  }
  uint32_t crc = crc32c(header);
  for (size_t i = 0; i < iovlen; ++i) crc = crc32c_extend(crc, part(i));
  if (tag) crc = crc32c_extend(crc, std::span<const std::byte>(trailer, tag));
  put_crc(crc, std::span<std::byte, kCrcSize>(trailer + tag, kCrcSize));
  return tag;
}

// The injector's verdict on the next segment (none unless SLOTSTREAM_UDP_INJECT_* asks).
Injector::Verdict inject(size_t bytes) {
  if (!config().inject.any()) return {};
  std::lock_guard lock(g_inject_mu);
  return injector().next(bytes);
}

// One segment ready to go: headers, the payload's pieces and the trailer as one scatter list (or, corrupted by
// the injector, one flat copy). Its iov points into itself: it stays where it was made.
struct Prepared {
  std::byte header[kMaxHeaderSize];
  std::byte trailer[kMaxTrailerSize];
  std::vector<iovec> iov;
  std::vector<std::byte> flat;
  Injector::Verdict verdict;
};

// Makes segment h carrying the `len` payload bytes of iov: headers, [MAC,] CRC, and the injector's verdict.
void prepare(Prepared* p, SegmentHeader h, const iovec* iov, size_t iovlen, size_t len) {
  h.has_mac = config().keyed;
  const size_t hs = encode_header(h, len, p->header);
  const size_t tag = seal(std::span(p->header, hs), iov, iovlen, p->trailer);
  p->verdict = inject(hs + len + tag + kCrcSize);
  p->iov.clear();
  p->iov.push_back({p->header, hs});
  p->iov.insert(p->iov.end(), iov, iov + iovlen);
  p->iov.push_back({p->trailer, tag + kCrcSize});
  if (p->verdict.flip_bit >= 0 && !p->verdict.drop) {
    // Corrupt a copy after the CRC was computed: the receiver must catch it.
    for (const iovec& x : p->iov) {
      auto* b = static_cast<const std::byte*>(x.iov_base);
      p->flat.insert(p->flat.end(), b, b + x.iov_len);
    }
    Injector::corrupt(p->flat, p->verdict);
    p->iov = {{p->flat.data(), p->flat.size()}};
    ++g_counters.injected_corrupt;
  }
}

// The segments as they go on the wire, in order: the injector's drops left out (counted "sent": the network lost
// them), its duplicates twice.
std::vector<const Prepared*> wire_order(const std::vector<Prepared>& parts) {
  std::vector<const Prepared*> wire;
  wire.reserve(parts.size() + 1);
  for (const Prepared& p : parts) {
    if (p.verdict.drop) {
      ++g_counters.injected_loss;
      continue;
    }
    wire.push_back(&p);
    if (p.verdict.duplicate) {
      ++g_counters.injected_duplicate;
      wire.push_back(&p);
    }
  }
  return wire;
}

// Whether fd's segments may go as UDP GSO messages: enabled, the kernel knows UDP_SEGMENT for this socket (asked
// once per socket, then remembered), and the application passes no UDP_SEGMENT of its own.
bool gso_usable(int fd, SocketInfo& info, const msghdr* msg) {
  if (!config().gso) return false;
  for (const cmsghdr* c = CMSG_FIRSTHDR(msg); c; c = CMSG_NXTHDR(const_cast<msghdr*>(msg), const_cast<cmsghdr*>(c))) {
    if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_SEGMENT) return false;
  }
  if (info.gso == GsoState::kUnknown) {
    int size = 0;
    socklen_t l = sizeof size;
    remember_gso(fd, &info, getsockopt(fd, SOL_UDP, UDP_SEGMENT, &size, &l) == 0);
  }
  return info.gso == GsoState::kUsable;
}

// What the kernel answers a UDP_SEGMENT it will not do for this socket or route (any other error is the send's).
bool gso_refusal(int err) {
  return err == EINVAL || err == EIO || err == ENOPROTOOPT || err == EOPNOTSUPP || err == EMSGSIZE;
}

// The messages for wire[from...]: one per GSO batch (shim/gso.h), or one per segment without GSO, each with msg's
// destination and control data (a batch's followed by its UDP_SEGMENT). The mmsghdrs point into the batches.
struct Outgoing {
  std::vector<GsoBatch> batches;
  std::vector<std::vector<iovec>> iov;
  std::vector<std::vector<uint64_t>> control;  // cmsghdr-aligned
  std::vector<mmsghdr> mm;
};

void add_gso_control(const msghdr* msg, uint16_t gso_size, std::vector<uint64_t>* buf, msghdr* out) {
  const size_t own = msg->msg_control ? msg->msg_controllen : 0, total = own + CMSG_SPACE(sizeof(uint16_t));
  buf->assign((total + 7) / 8, 0);
  if (own) std::memcpy(buf->data(), msg->msg_control, own);
  out->msg_control = buf->data();
  out->msg_controllen = total;
  cmsghdr* c = reinterpret_cast<cmsghdr*>(reinterpret_cast<std::byte*>(buf->data()) + own);
  c->cmsg_level = SOL_UDP;
  c->cmsg_type = UDP_SEGMENT;
  c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
  std::memcpy(CMSG_DATA(c), &gso_size, sizeof gso_size);
}

Outgoing plan_messages(const msghdr* msg, std::span<const Prepared* const> wire, bool gso, int family) {
  std::vector<size_t> sizes, pieces;
  for (const Prepared* p : wire) {
    sizes.push_back(iov_total(p->iov.data(), p->iov.size()));
    pieces.push_back(p->iov.size());
  }
  GsoLimits limits;
  limits.max_segments = gso ? limits.max_segments : 1;
  limits.max_bytes = max_payload(family);
  Outgoing o;
  o.batches = plan_gso_batches(sizes, pieces, limits);
  o.iov.resize(o.batches.size());
  o.control.resize(o.batches.size());
  o.mm.resize(o.batches.size());
  for (size_t b = 0; b < o.batches.size(); ++b) {
    const GsoBatch& g = o.batches[b];
    for (size_t i = g.first; i < g.first + g.count; ++i)
      o.iov[b].insert(o.iov[b].end(), wire[i]->iov.begin(), wire[i]->iov.end());
    msghdr& h = o.mm[b].msg_hdr;
    h = *msg;
    h.msg_iov = o.iov[b].data();
    h.msg_iovlen = o.iov[b].size();
    if (g.gso_size) add_gso_control(msg, g.gso_size, &o.control[b], &h);
  }
  return o;
}

void count_sent(const Outgoing& o, size_t from, size_t n) {
  for (size_t b = from; b < from + n; ++b) {
    if (o.batches[b].gso_size == 0) continue;
    ++g_counters.gso_messages;
    g_counters.gso_segments += o.batches[b].count;
  }
}

// Sends prepared segments to msg's destination, with msg's control data: with GSO where the kernel does it, in
// sendmmsg, as many messages per call as the kernel takes. Once the first is out, the rest follow even on a
// non-blocking socket (waiting up to a second for room each time), so that a large datagram is not cut short by a
// full send buffer. A GSO message the kernel refuses is sent again a segment per message, and once that works the
// refusal is remembered for the socket (an error the plain send repeats is the send's, not GSO's). False (errno
// set) if nothing could be sent, or a later call failed otherwise.
bool send_prepared(int fd, const msghdr* msg, std::vector<Prepared>& parts, int flags, SocketInfo& info) {
  const std::vector<const Prepared*> wire = wire_order(parts);
  bool gso = wire.size() > 1 && gso_usable(fd, info, msg), refused = false, sent_any = false;
  Outgoing out = plan_messages(msg, wire, gso, info.family);
  for (size_t done = 0; done < out.mm.size();) {
    const int r = real().sendmmsg(fd, out.mm.data() + done, unsigned(out.mm.size() - done), flags);
    if (r > 0) {
      count_sent(out, done, size_t(r));
      done += size_t(r);
      sent_any = true;
      if (refused) remember_gso(fd, &info, false);
      refused = false;
      continue;
    }
    if (gso && gso_refusal(errno) && out.batches[done].gso_size) {
      gso = false;
      refused = true;
      out = plan_messages(msg, std::span(wire).subspan(out.batches[done].first), false, info.family);
      done = 0;
      continue;
    }
    pollfd room{fd, POLLOUT, 0};
    if (!sent_any || (errno != EAGAIN && errno != EWOULDBLOCK) || real().poll(&room, 1, 1000) <= 0) return false;
  }
  return true;
}

// [off, off + len) of a scatter list, as a scatter list.
void slice(const iovec* iov, size_t n, size_t off, size_t len, std::vector<iovec>* out) {
  out->clear();
  for (size_t i = 0; i < n && len > 0; ++i) {
    if (off >= iov[i].iov_len) {
      off -= iov[i].iov_len;
      continue;
    }
    const size_t k = std::min(iov[i].iov_len - off, len);
    out->push_back({static_cast<char*>(iov[i].iov_base) + off, k});
    len -= k;
    off = 0;
  }
}

// A datagram larger than one MTU: one UD RDMA Write-Record message in MTU-sized segments (engine/dgram/wire/segments.h,
// the Write-Record descriptor's addressing), handed to the kernel together.
bool send_large(int fd, const msghdr* msg, int flags, SocketInfo& info, size_t len) {
  const MessageSlot slot{0, 0, next_msn(fd), kShimRing, kShimFirstStag, len};
  SegmentHeader h = kWriteRecord.data_header(slot);
  h.service = Service::kUD;
  h.source_qp = info.qp;
  const size_t seg = segment_max(info.family);
  std::vector<Prepared> parts(segment_count(len, seg));  // never reallocated: each iov points into its part
  std::vector<iovec> piece;
  size_t i = 0;
  for_each_segment(h, len, seg, [&](const SegmentHeader& s, uint64_t off, uint64_t n) {
    slice(msg->msg_iov, msg->msg_iovlen, off, n, &piece);
    prepare(&parts[i++], s, piece.data(), piece.size(), n);
    return true;
  });
  if (!send_prepared(fd, msg, parts, flags, info)) return false;
  g_counters.segments += parts.size();
  ++g_counters.large;
  return true;
}

// A datagram that fits one MTU: one UD Send segment (queue 0, the socket's own MSN, MO 0, last).
bool send_small(int fd, const msghdr* msg, int flags, SocketInfo& info, size_t len) {
  SegmentHeader h;
  h.service = Service::kUD;
  h.opcode = Opcode::kSend;
  h.last = true;
  h.source_qp = info.qp;
  h.queue = 0;
  h.msn = next_msn(fd);
  h.offset = 0;
  std::vector<Prepared> one(1);
  prepare(&one[0], h, msg->msg_iov, msg->msg_iovlen, len);
  return send_prepared(fd, msg, one, flags, info);
}

}  // namespace

ssize_t shim_sendmsg(int fd, const msghdr* msg, int flags) {
  SocketInfo info;
  if (!classify(fd, &info)) return real().sendmsg(fd, msg, flags);
  const uint16_t remote = msg->msg_name ? port_of(msg->msg_name, msg->msg_namelen) : info.peer_port;
  if (!config().ports.applies(info.local_port, remote)) {
    ++g_counters.passed;
    return real().sendmsg(fd, msg, flags);
  }
  const size_t len = iov_total(msg->msg_iov, msg->msg_iovlen);
  if (len > max_payload(info.family)) {
    ++g_counters.emsgsize;
    errno = EMSGSIZE;
    return -1;
  }
  const bool sent =
      len > small_max(info.family) ? send_large(fd, msg, flags, info, len) : send_small(fd, msg, flags, info, len);
  if (!sent) return -1;
  ++g_counters.wrapped;
  if (info.local_port == 0) forget_peer(fd);  // the first send bound it: learn the port next time
  return ssize_t(len);
}

ssize_t shim_send_buf(int fd, const void* buf, size_t len, int flags, const sockaddr* to, socklen_t tolen) {
  iovec iov{const_cast<void*>(buf), len};
  msghdr m{};
  m.msg_name = const_cast<sockaddr*>(to);
  m.msg_namelen = to ? tolen : 0;
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  return shim_sendmsg(fd, &m, flags);
}

}  // namespace slotstream::dgram::shim
