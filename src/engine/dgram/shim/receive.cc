// The preload shim's receive path: a datagram read from the kernel is checked (CRC first, then the MAC when
// keyed) and handed to the application, or, a segment of a large datagram, placed in its socket's recombination
// (shim/reassembly.h) until the datagram completes; segments are read in recvmmsg batches, a datagram for the
// application read among them waits in the socket's queue. Also what the readiness wrappers ask (shim.h).
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "engine/dgram/shim/internal.h"
#include "engine/dgram/wire/mac.h"
#include "engine/dgram/wire/wire.h"

namespace slotstream::dgram::shim {

namespace {

constexpr size_t kRxBuffer = 65536;

std::byte* rx_buffer() {
  thread_local std::vector<std::byte> buf(kRxBuffer);
  return buf.data();
}

// Ancillary data comes into the shim's own buffer, so that a segment's (IP_PKTINFO: the multicast group it was
// sent to) can travel with the datagram it becomes part of, read whichever call the application makes.
constexpr size_t kControlBuffer = 1024;

std::byte* control_buffer() {
  alignas(cmsghdr) thread_local std::byte buf[kControlBuffer];
  return buf;
}

// Copies ancillary data into the application's buffer as the kernel's put_cmsg does: whole messages while they
// fit, the one that does not truncated (MSG_CTRUNC); returns the bytes used.
size_t put_control(std::span<const std::byte> control, msghdr* msg, int* msg_flags) {
  auto* dst = static_cast<std::byte*>(msg->msg_control);
  const size_t room = dst ? msg->msg_controllen : 0;
  size_t used = 0;
  msghdr src{};
  src.msg_control = const_cast<std::byte*>(control.data());
  src.msg_controllen = control.size();
  for (cmsghdr* c = control.empty() ? nullptr : CMSG_FIRSTHDR(&src); c; c = CMSG_NXTHDR(&src, c)) {
    if (room - used < sizeof(cmsghdr)) {
      *msg_flags |= MSG_CTRUNC;
      break;
    }
    const size_t n = std::min<size_t>(c->cmsg_len, room - used);
    std::memcpy(dst + used, c, n);
    if (n < c->cmsg_len) {
      reinterpret_cast<cmsghdr*>(dst + used)->cmsg_len = n;
      *msg_flags |= MSG_CTRUNC;
      return room;
    }
    used = std::min(used + CMSG_ALIGN(c->cmsg_len), room);
  }
  return used;
}

// Copies `n` bytes into the scatter list; returns how many fit.
size_t scatter(const std::byte* src, size_t n, const iovec* iov, size_t iovlen) {
  size_t done = 0;
  for (size_t i = 0; i < iovlen && done < n; ++i) {
    const size_t k = std::min(iov[i].iov_len, n - done);
    if (k) std::memcpy(iov[i].iov_base, src + done, k);
    done += k;
  }
  return done;
}

// Hands `payload` to the application as recvmsg would: the address, ancillary data, MSG_TRUNC in and out.
ssize_t deliver(std::span<const std::byte> payload, const sockaddr_storage& from, socklen_t from_len,
                std::span<const std::byte> control, int kernel_flags, msghdr* msg, int flags) {
  const size_t room = iov_total(msg->msg_iov, msg->msg_iovlen);
  const size_t copied = scatter(payload.data(), payload.size(), msg->msg_iov, msg->msg_iovlen);
  if (msg->msg_name) std::memcpy(msg->msg_name, &from, std::min<size_t>(msg->msg_namelen, from_len));
  msg->msg_namelen = from_len;
  int out_flags = (kernel_flags & ~MSG_TRUNC) | (payload.size() > room ? MSG_TRUNC : 0);
  msg->msg_controllen = put_control(control, msg, &out_flags);
  msg->msg_flags = out_flags;
  return (flags & MSG_TRUNC) ? ssize_t(payload.size()) : ssize_t(copied);
}

// A recombined datagram waiting in the shim (reassembly timers run first): handed over as recvmsg
// would, *result set, true; false if there is none.
bool take_ready(int fd, SocketInfo& info, msghdr* msg, int flags, ssize_t* result) {
  const auto st = info.rx ? info.rx : nullptr;
  if (!st) return false;
  std::lock_guard lock(st->mu);
  st->reassembly.expire(now_ns(), &st->ready);
  if (st->ready.empty()) return false;
  const ShimDatagram& d = st->ready.front();
  *result = deliver(d.data, d.from, d.from_len, d.control, 0, msg, flags);
  if (!(flags & MSG_PEEK)) {
    if (!d.counted) ++g_counters.unwrapped;
    st->ready.pop_front();
  }
  (void)fd;
  return true;
}

enum class Fate {
  kDeliver,  // the application's datagram as it is (its payload)
  kTaken,    // the shim's: a segment placed, or a datagram dropped (counted)
};

// Whether a datagram starts as the shim's do: one that does and fails is corrupted, not plain.
bool claims_ours(std::span<const std::byte> d) {
  return d.size() >= 2 && d[0] == std::byte{kMagic0} && d[1] == std::byte{kMagic1};
}

// One datagram read from the kernel: its bytes, sender and ancillary data.
struct Received {
  std::span<const std::byte> data;
  sockaddr_storage from{};
  socklen_t from_len = 0;
  std::span<const std::byte> control;
  int flags = 0;  // the kernel's msg_flags
};

// Reads the head of fd's queue into the shim's buffers (the whole datagram: the CRC covers all of it).
ssize_t read_datagram(int fd, int flags, Received* r) {
  iovec iov{rx_buffer(), kRxBuffer};
  msghdr m{};
  m.msg_name = &r->from;
  m.msg_namelen = sizeof r->from;
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = control_buffer();
  m.msg_controllen = kControlBuffer;
  const ssize_t n = real().recvmsg(fd, &m, flags);
  if (n < 0) return n;
  r->data = std::span(rx_buffer(), size_t(n));
  r->from_len = m.msg_namelen;
  r->control = std::span(control_buffer(), m.msg_controllen);
  r->flags = m.msg_flags;
  return n;
}

// What one datagram read from the kernel is. With `peek` (it is still queued), deliveries are not
// counted (they will be read again); what the shim takes is, once.
Fate judge(int fd, SocketInfo& info, const Received& r, bool peek, std::span<const std::byte>* payload) {
  const std::span<const std::byte> d = r.data;
  const sockaddr_storage& from = r.from;
  if (!config().ports.applies(info.local_port, port_of(from))) {
    if (!peek) ++g_counters.passed;
    *payload = d;
    return Fate::kDeliver;
  }
  DecodeError why;
  const auto seg = decode_segment(d, &why);
  if (!seg) {
    if (claims_ours(d)) {
      ++(why == DecodeError::kCrc ? g_counters.dropped_crc : g_counters.dropped_malformed);
      return Fate::kTaken;
    }
    if (!config().plain_accept) {
      ++g_counters.dropped_plain;
      return Fate::kTaken;
    }
    if (!peek) ++g_counters.plain_accepted;
    *payload = d;
    return Fate::kDeliver;
  }
  const SegmentHeader& h = seg->header;
  // With a key only signed segments count; without one, a signed segment cannot be checked.
  if (!(mac() ? mac()->verify(*seg) : !h.has_mac)) {
    ++g_counters.dropped_auth;
    return Fate::kTaken;
  }
  if (h.service == Service::kUD && h.opcode == Opcode::kSend && h.last && h.offset == 0 && h.queue == 0) {
    if (!peek) ++g_counters.unwrapped;
    *payload = seg->payload;
    return Fate::kDeliver;
  }
  const auto st = h.service == Service::kUD && h.opcode == Opcode::kWriteRecord ? rx_state(fd, &info) : nullptr;
  if (!st) {
    ++g_counters.dropped_malformed;
    return Fate::kTaken;
  }
  ++g_counters.segments_in;
  std::lock_guard lock(st->mu);
  st->reassembly.feed(*seg, from, r.from_len, r.control, now_ns(), &st->ready);
  return Fate::kTaken;
}

// Takes the datagram at the head of the kernel's queue off it (after a peek showed it is the shim's).
void discard_head(int fd) {
  iovec skip{rx_buffer(), kRxBuffer};
  msghdr d{};
  d.msg_iov = &skip;
  d.msg_iovlen = 1;
  (void)real().recvmsg(fd, &d, MSG_DONTWAIT);
}

void learn_local_port(int fd, SocketInfo& info) {
  if (info.local_port != 0) return;
  sockaddr_storage ss{};
  socklen_t l = sizeof ss;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &l) == 0) info.local_port = port_of(ss);
}

// A datagram for the application that the shim read ahead: kept in the shim's queue, in the order read.
void keep_for_app(int fd, SocketInfo& info, const Received& r, std::span<const std::byte> payload, bool counted) {
  if (const auto st = rx_state(fd, &info)) {
    ShimDatagram d;
    d.from = r.from;
    d.from_len = r.from_len;
    d.data = Buffer(payload.size());
    std::memcpy(d.data.data(), payload.data(), payload.size());
    d.data.set_size(payload.size());
    d.control.assign(r.control.begin(), r.control.end());
    d.counted = counted;
    std::lock_guard lock(st->mu);
    st->ready.push_back(std::move(d));
  }
}

// Segments arrive in runs (one large datagram is ~45 of them): the shim reads what is queued in one recvmmsg of
// up to kBatch datagrams rather than one recvmsg (and one peek) each. A datagram for the application among them
// waits in the shim's queue, with its own address and ancillary data, behind what was read before it. The buffers
// are per thread, 64 KiB each (a plain datagram may be that large), allocated untouched: only the pages the kernel
// writes become resident.
constexpr unsigned kBatch = 16;

struct BatchBuffers {
  std::unique_ptr<std::byte[]> data{new std::byte[kBatch * kRxBuffer]};
  alignas(cmsghdr) std::byte control[kBatch][kControlBuffer];
  sockaddr_storage from[kBatch];
  iovec iov[kBatch];
  mmsghdr hdr[kBatch];
};

// Reads up to kBatch queued datagrams (never blocks) and places or keeps each; returns how many were read.
int take_batch(int fd, SocketInfo& info) {
  thread_local std::unique_ptr<BatchBuffers> tb;
  if (!tb) tb = std::make_unique<BatchBuffers>();
  BatchBuffers& b = *tb;
  for (unsigned i = 0; i < kBatch; ++i) {
    b.iov[i] = {b.data.get() + i * kRxBuffer, kRxBuffer};
    b.hdr[i].msg_hdr = msghdr{&b.from[i], sizeof b.from[i], &b.iov[i], 1, b.control[i], kControlBuffer, 0};
  }
  const int n = real().recvmmsg(fd, b.hdr, kBatch, MSG_DONTWAIT, nullptr);
  if (n > 0) learn_local_port(fd, info);
  for (int i = 0; i < n; ++i) {
    const msghdr& m = b.hdr[i].msg_hdr;
    Received r;
    r.data = std::span(b.data.get() + size_t(i) * kRxBuffer, b.hdr[i].msg_len);
    r.from = b.from[i];
    r.from_len = m.msg_namelen;
    r.control = std::span(b.control[i], m.msg_controllen);
    r.flags = m.msg_flags;
    std::span<const std::byte> payload;
    if (judge(fd, info, r, false, &payload) == Fate::kDeliver) keep_for_app(fd, info, r, payload, true);
  }
  return n;
}

// A blocking receive's SO_RCVTIMEO across the datagrams the shim takes. The kernel starts the timeout afresh at
// every real recvmsg, so a stream of segments that complete nothing would keep a receive with a timeout blocked
// for ever; once the shim has taken one, it waits for the rest itself, up to the timeout counted from the call.
class RecvDeadline {
 public:
  // After the shim took a datagram in a call that may block (nothing is asked before: no cost otherwise).
  void arm(int fd) {
    if (at_ != kUnarmed) return;
    timeval tv{};
    socklen_t l = sizeof tv;
    const bool set = getsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, &l) == 0 && (tv.tv_sec > 0 || tv.tv_usec > 0);
    at_ = set ? start_ + int64_t(tv.tv_sec) * 1'000'000'000 + int64_t(tv.tv_usec) * 1000 : INT64_MAX;
  }
  int64_t at() const { return at_ == kUnarmed ? INT64_MAX : at_; }

 private:
  static constexpr int64_t kUnarmed = INT64_MIN;
  int64_t start_ = now_ns();
  int64_t at_ = kUnarmed;
};

enum class Wait {
  kRead,      // read from the kernel (with *read_flags)
  kLook,      // a partial-delivery timer fired: look at the shim's queue again
  kTimedOut,  // SO_RCVTIMEO passed: EAGAIN
  kFailed,    // poll failed (EINTR): errno set
};

// Before a blocking read: waits itself, with poll, while partial delivery has a timer running (the wait ends at
// it) or the shim keeps SO_RCVTIMEO (the wait ends there, and the read that follows does not block).
Wait wait_for_data(int fd, const SocketInfo& info, int flags, const RecvDeadline& deadline, int* read_flags) {
  if (flags & MSG_DONTWAIT) return Wait::kRead;
  int64_t wake = INT64_MAX;
  if (info.rx) {
    std::lock_guard lock(info.rx->mu);
    wake = info.rx->reassembly.wake_ns();
  }
  const int64_t until = std::min(wake, deadline.at());
  if (until == INT64_MAX || (fcntl(fd, F_GETFL) & O_NONBLOCK)) return Wait::kRead;
  pollfd p{fd, POLLIN, 0};
  const int rc = real().poll(&p, 1, ms_until(until));
  if (rc < 0) return Wait::kFailed;
  if (rc > 0) {
    if (deadline.at() != INT64_MAX) *read_flags |= MSG_DONTWAIT;
    return Wait::kRead;
  }
  return now_ns() >= wake ? Wait::kLook : Wait::kTimedOut;
}

}  // namespace

// Descriptors another process passed (SCM_RIGHTS): new numbers, which may be UDP sockets.
void forget_passed(const msghdr* msg) {
  if (!msg->msg_control || msg->msg_controllen == 0) return;
  for (const cmsghdr* c = CMSG_FIRSTHDR(msg); c; c = CMSG_NXTHDR(const_cast<msghdr*>(msg), const_cast<cmsghdr*>(c))) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < n; ++i) {
      int passed;
      std::memcpy(&passed, CMSG_DATA(c) + i * sizeof(int), sizeof passed);
      forget_fd(passed);
    }
  }
}

// recvmsg on a UDP socket the caller classified (`info`): each wrapper classifies once.
ssize_t recv_udp(int fd, SocketInfo& info, msghdr* msg, int flags) {
  if (flags & MSG_ERRQUEUE) return real().recvmsg(fd, msg, flags);
  RecvDeadline deadline;
  for (;;) {
    ssize_t result;
    if (take_ready(fd, info, msg, flags, &result)) return result;
    int read_flags = flags & ~MSG_TRUNC;  // the whole datagram; MSG_TRUNC is answered by deliver()
    switch (wait_for_data(fd, info, flags, deadline, &read_flags)) {
      case Wait::kRead:
        break;
      case Wait::kLook:
        continue;
      case Wait::kTimedOut:
        errno = EAGAIN;
        return -1;
      case Wait::kFailed:
        return -1;
    }
    Received r;
    if (read_datagram(fd, read_flags, &r) < 0) {
      // A read the shim made non-blocking, whose datagram another thread took first: wait again.
      if ((read_flags & ~flags & MSG_DONTWAIT) && (errno == EAGAIN || errno == EWOULDBLOCK)) continue;
      return -1;
    }
    learn_local_port(fd, info);
    std::span<const std::byte> payload;
    if (judge(fd, info, r, flags & MSG_PEEK, &payload) == Fate::kDeliver)
      return deliver(payload, r.from, r.from_len, r.control, r.flags, msg, flags);
    // A segment or a dropped datagram: nothing for the application yet. A peeked one leaves the queue; after a
    // read one, the rest of its message is likely queued: taken in batches.
    if (flags & MSG_PEEK)
      discard_head(fd);
    else
      take_batch(fd, info);
    if (!(flags & MSG_DONTWAIT)) deadline.arm(fd);
  }
}

ssize_t shim_recvmsg(int fd, msghdr* msg, int flags) {
  SocketInfo info;
  if ((flags & MSG_ERRQUEUE) || !classify(fd, &info)) {
    const ssize_t n = real().recvmsg(fd, msg, flags);
    if (n >= 0) forget_passed(msg);
    return n;
  }
  return recv_udp(fd, info, msg, flags);
}

// recv/recvfrom/read: one buffer. `info`: the socket, classified by the caller, or nullptr.
ssize_t shim_recv_buf(int fd, void* buf, size_t len, int flags, sockaddr* from, socklen_t* fromlen, SocketInfo* info) {
  iovec iov{buf, len};
  msghdr m{};
  m.msg_name = from;
  m.msg_namelen = from && fromlen ? *fromlen : 0;
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  ssize_t n = info ? recv_udp(fd, *info, &m, flags) : shim_recvmsg(fd, &m, flags);
  if (n >= 0 && from && fromlen) *fromlen = m.msg_namelen;
  return n;
}

// recvmmsg as the kernel's __sys_recvmmsg runs it: each datagram received as recvmsg would be (blocking unless
// MSG_DONTWAIT; MSG_WAITFORONE makes the ones after the first non-blocking), `timeout` checked after each datagram
// (not while waiting for one: the kernel's documented limitation) and the time left written back to it.
int shim_recvmmsg(int fd, SocketInfo& info, mmsghdr* vec, unsigned vlen, int flags, timespec* timeout) {
  int64_t end = 0;
  if (timeout) {
    if (timeout->tv_sec < 0 || timeout->tv_nsec < 0 || timeout->tv_nsec >= 1'000'000'000) {
      errno = EINVAL;
      return -1;
    }
    end = now_ns() + int64_t(timeout->tv_sec) * 1'000'000'000 + timeout->tv_nsec;
  }
  int each = flags & ~MSG_WAITFORONE;
  unsigned i = 0;
  for (; i < vlen; ++i) {
    const ssize_t n = recv_udp(fd, info, &vec[i].msg_hdr, each);
    if (n < 0) {
      if (i == 0) return -1;
      break;  // the kernel keeps a later error for the next call; EAGAIN/EINTR end the batch the same way
    }
    vec[i].msg_len = unsigned(n);
    if (flags & MSG_WAITFORONE) each |= MSG_DONTWAIT;
    if (timeout) {
      const int64_t left = std::max<int64_t>(end - now_ns(), 0);
      timeout->tv_sec = time_t(left / 1'000'000'000);
      timeout->tv_nsec = long(left % 1'000'000'000);
      if (left == 0) {
        ++i;
        break;
      }
    }
  }
  return int(i);
}

namespace {

// Whether the datagram whose first bytes are `head` is one recv would hand over: a datagram of a port the shim
// leaves alone, a plain one accepted, or a small UD Send. Its CRC (and MAC) are checked when it is read, so a
// corrupted or forged small datagram can make a socket readable once, and recv then drops it (EAGAIN for a
// non-blocking one); everything else the shim takes is taken before the application is told.
bool looks_deliverable(const SocketInfo& info, std::span<const std::byte> head, const sockaddr_storage& from) {
  if (!config().ports.applies(info.local_port, port_of(from))) return true;
  if (!claims_ours(head)) return config().plain_accept;
  if (head.size() < kCommonSize) return false;
  const auto ddp = uint8_t(head[3]), rdmap = uint8_t(head[4]), service = uint8_t(head[5]);
  return service == uint8_t(Service::kUD) && (rdmap & 0x0F) == uint8_t(Opcode::kSend) && (ddp & kDdpLast) &&
         !(ddp & kDdpTagged);
}

}  // namespace

bool any_held() { return g_rx_states.load(std::memory_order_relaxed) > 0; }

Readiness readiness(int fd, bool drain) {
  SocketInfo info;
  if (!classify(fd, &info)) return {};
  Readiness r;
  r.udp = true;
  if (info.rx) {
    std::lock_guard lock(info.rx->mu);
    info.rx->reassembly.expire(now_ns(), &info.rx->ready);
    r.readable = !info.rx->ready.empty();
    r.wake_ns = info.rx->reassembly.wake_ns();
    if (r.readable) return r;
  }
  if (!drain) return r;
  // The head of the kernel's queue, its first bytes only: enough to tell the application's from the shim's.
  std::byte head[kCommonSize];
  sockaddr_storage from{};
  iovec iov{head, sizeof head};
  msghdr m{};
  m.msg_name = &from;
  m.msg_namelen = sizeof from;
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  const ssize_t n = real().recvmsg(fd, &m, MSG_PEEK | MSG_DONTWAIT);
  if (n < 0) return r;  // nothing queued
  learn_local_port(fd, info);
  if (looks_deliverable(info, std::span(head, std::min(size_t(n), sizeof head)), from)) {
    r.readable = true;
    return r;
  }
  // The shim's: read it and what follows in batches until a datagram is ready or the queue is empty (what
  // arrives later makes the socket readable, and a new edge, again).
  while (take_batch(fd, info) > 0) {
    if (!info.rx) continue;  // only dropped datagrams so far
    std::lock_guard lock(info.rx->mu);
    r.readable = !info.rx->ready.empty();
    r.wake_ns = info.rx->reassembly.wake_ns();
    if (r.readable) break;
  }
  return r;
}

}  // namespace slotstream::dgram::shim
