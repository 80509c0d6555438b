// libslotstream_udp.so: the patent's socket interface ("iWARP Socket Interface"): preloaded into an
// unmodified program (LD_PRELOAD), it overrides the data calls on its UDP sockets — not their
// creation ("this embodiment does not override the creation of sockets, only the data operations
// related to them") — so that every application datagram travels as one datagram RDMA message:
//
//   - one that fits one MTU-sized datagram with its headers: one UD Send segment (queue 0, the socket's
//     own MSN, MO 0, last) with its CRC32C trailer (engine/dgram/wire/wire.h) — 28 bytes more;
//   - a larger one (up to the 65,507 bytes UDP allows over IPv4, 65,527 over IPv6): one UD RDMA
//     Write-Record message in MTU-sized DDP segments (engine/dgram/wire/segments.h; STag kShimFirstStag + MSN mod
//     kShimRing, the MSN in every segment, 32 bytes more per segment), so that IP never fragments it
//     (patent: "for messages larger than 1.5 KB, multiple datagrams comprise a single message, and they
//     are recombined at the receiver"). The receiving shim recombines it with the datagram receiver's own
//     Write-Record placement (shim/reassembly.h) before recv/recvfrom/recvmsg/read return it; one whose
//     reassembly timer fires incomplete is dropped (default) or, with SLOTSTREAM_UDP_PARTIAL=deliver,
//     delivered with its holes zero-filled (for media that prefers a damaged frame to none).
//
// The program keeps its real file descriptor, so fork, dup2, O_NONBLOCK and socket options work as before.
// Readiness (shim/readiness.cc): poll, ppoll, select, pselect, epoll_wait and epoll_pwait are wrapped too,
// so that a segment that completes no datagram, or a datagram the shim drops, never reports a socket
// readable; a recombined datagram waiting in the shim does, and partial delivery wakes the waiter when its
// timer fires.
//
// A large datagram's segments are handed to the kernel with UDP GSO (UDP_SEGMENT, Linux >= 4.18; shim/gso.h):
// laid back to back, all of one size but the last, in one sendmsg whose UDP_SEGMENT control message makes the kernel
// cut the buffer at the segments' boundaries — the same datagrams on the wire, one trip through UDP and IP instead
// of one per segment. Where the kernel has no UDP_SEGMENT or refuses it for the socket (EINVAL, EIO, ENOPROTOOPT,
// EOPNOTSUPP, EMSGSIZE: e.g. SO_NO_CHECK, a route below the MTU the shim assumes), the refusal is remembered for the
// socket (counted: gso_refused) and its segments go one per message in one sendmmsg, as with SLOTSTREAM_UDP_GSO=off
// or when the application passes a UDP_SEGMENT of its own.
//
// On send the payload is gathered behind each header with no copy; on receive each datagram is read into a
// per-thread buffer, checked (CRC first) and its payload copied out (a recombined one: from its region). A
// datagram that fails is dropped as the kernel drops one with a bad UDP checksum: a blocking call waits for
// the next datagram, a non-blocking one returns EAGAIN. MSG_PEEK, MSG_TRUNC (in and out), MSG_DONTWAIT are
// honoured; a payload larger than UDP allows fails with EMSGSIZE. Ancillary data is read into the shim's own
// buffer and copied out as the kernel would (MSG_CTRUNC when it does not fit); a recombined datagram carries
// its first segment's (IP_PKTINFO: the multicast group it was sent to). SO_RCVTIMEO holds across the
// datagrams the shim takes in one blocking call. Descriptors dup()ed from one socket share its recombination.
//
// Multicast sockets take the same path: the group is only a destination address to the sending shim, and each
// receiving socket (several in one process with SO_REUSEADDR each get every datagram) recombines on its own,
// keyed by the sender's address and source QP. IP_MULTICAST_TTL/IF/LOOP and IP_ADD_MEMBERSHIP are the
// kernel's, untouched.
//
// Datagrams from a program without the shim (no 'SD' magic) are dropped and counted (dropped_plain), or
// delivered unchanged with SLOTSTREAM_UDP_PLAIN=accept; one with the magic and a wrong CRC is a corrupted
// shim datagram and always dropped (dropped_crc).
//
// Covered: send, sendto, sendmsg, sendmmsg, write, writev; recv, recvfrom, recvmsg, recvmmsg, read, readv,
// and the fortified __recv_chk, __recvfrom_chk, __read_chk; poll, ppoll, select, pselect, epoll_ctl,
// epoll_wait, epoll_pwait. Not covered (they go to the kernel unchanged): sendfile/splice into a UDP socket,
// io_uring, calls glibc makes internally (e.g. stdio on a socket), and programs that make system calls
// without libc (Go).
//
// A CRC is not authentication: anyone who can reach the program's port can send it a datagram with
// a right CRC, and it is delivered. With SLOTSTREAM_UDP_KEY_FILE (the same file for every program
// that talks to each other) every segment also carries a MAC (engine/dgram/wire/mac.h: HMAC-SHA256 under a key
// derived from the file) and one without a right MAC is dropped (counted: dropped_auth); a
// datagram with a MAC reaching a program without the key is dropped too. A whole datagram captured
// on the way can still be replayed (there is no session to number them in). SLOTSTREAM_UDP_PLAIN=accept
// lets anyone's plain datagrams in, key or not.
//
// Environment:
//   SLOTSTREAM_UDP_KEY_FILE       a shared secret (the file's contents, trailing whitespace removed):
//                                 sign every segment and accept only signed ones
//   SLOTSTREAM_UDP_PORTS          which datagrams: "5000-5999,8000" (either end's port); default
//                                 every one except port 53; "all" (engine/dgram/shim/ports.h)
//   SLOTSTREAM_UDP_MTU            the path MTU segments are sized for (576..65535, default 1500)
//   SLOTSTREAM_UDP_PARTIAL        drop (default) | deliver: an incomplete large datagram at its timer
//   SLOTSTREAM_UDP_REASSEMBLY_MS  a large datagram's timer from its first segment (1..600000, default 200)
//   SLOTSTREAM_UDP_PLAIN          drop (default) | accept: datagrams from programs without the shim
//   SLOTSTREAM_UDP_GSO            on (default) | off: a large datagram's segments go to the kernel as one UDP GSO
//                                 message (shim/gso.h) or, off, one message each in a sendmmsg
//   SLOTSTREAM_UDP_LOG            "1": counters on stderr at exit; a path: appended there
//   SLOTSTREAM_UDP_INJECT_LOSS    percent of sent segments dropped (tests; seeded)
//   SLOTSTREAM_UDP_INJECT_CORRUPT percent of sent segments with one bit flipped after the CRC
//   SLOTSTREAM_UDP_INJECT_DUPLICATE percent sent twice
//   SLOTSTREAM_UDP_INJECT_SEED    seed (default 1)
// A malformed setting stops the program at start with the reason (nothing is silently unwrapped).
//
// The shim's parts: config.cc (the environment, counters), fd_table.cc (which descriptors are UDP sockets, and
// their state), send.cc (segments and GSO), receive.cc (checks and recombination), readiness.cc (poll, select,
// epoll); this file holds the libc wrappers themselves, each of which classifies its descriptor once and hands a
// UDP socket's call to the send or receive path.
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstdarg>

#include "engine/dgram/shim/internal.h"

using namespace slotstream::dgram::shim;

// ------------------------------------------------------------------ the overrides

extern "C" {

ssize_t sendmsg(int fd, const msghdr* msg, int flags) { return shim_sendmsg(fd, msg, flags); }

ssize_t sendto(int fd, const void* buf, size_t len, int flags, const sockaddr* to, socklen_t tolen) {
  return shim_send_buf(fd, buf, len, flags, to, tolen);
}

ssize_t send(int fd, const void* buf, size_t len, int flags) { return shim_send_buf(fd, buf, len, flags, nullptr, 0); }

int sendmmsg(int fd, mmsghdr* vec, unsigned vlen, int flags) {
  SocketInfo info;
  if (!classify(fd, &info)) return real().sendmmsg(fd, vec, vlen, flags);
  unsigned i = 0;
  for (; i < vlen; ++i) {
    ssize_t n = shim_sendmsg(fd, &vec[i].msg_hdr, flags);
    if (n < 0) return i == 0 ? -1 : int(i);
    vec[i].msg_len = unsigned(n);
  }
  return int(i);
}

ssize_t write(int fd, const void* buf, size_t len) {
  SocketInfo info;
  if (!classify(fd, &info)) return real().write(fd, buf, len);
  return shim_send_buf(fd, buf, len, 0, nullptr, 0);
}

ssize_t writev(int fd, const iovec* iov, int iovcnt) {
  SocketInfo info;
  if (!classify(fd, &info)) return real().writev(fd, iov, iovcnt);
  msghdr m{};
  m.msg_iov = const_cast<iovec*>(iov);
  m.msg_iovlen = size_t(iovcnt);
  return shim_sendmsg(fd, &m, 0);
}

ssize_t recvmsg(int fd, msghdr* msg, int flags) { return shim_recvmsg(fd, msg, flags); }

ssize_t recvfrom(int fd, void* buf, size_t len, int flags, sockaddr* from, socklen_t* fromlen) {
  return shim_recv_buf(fd, buf, len, flags, from, fromlen);
}

ssize_t recv(int fd, void* buf, size_t len, int flags) { return shim_recv_buf(fd, buf, len, flags, nullptr, nullptr); }

int recvmmsg(int fd, mmsghdr* vec, unsigned vlen, int flags, timespec* timeout) {
  SocketInfo info;
  if (!classify(fd, &info)) {
    const int n = real().recvmmsg(fd, vec, vlen, flags, timeout);
    for (int i = 0; i < n; ++i) forget_passed(&vec[i].msg_hdr);
    return n;
  }
  return shim_recvmmsg(fd, info, vec, vlen, flags, timeout);
}

ssize_t read(int fd, void* buf, size_t len) {
  SocketInfo info;
  if (!classify(fd, &info)) return real().read(fd, buf, len);
  return shim_recv_buf(fd, buf, len, 0, nullptr, nullptr, &info);
}

ssize_t readv(int fd, const iovec* iov, int iovcnt) {
  SocketInfo info;
  if (!classify(fd, &info)) return real().readv(fd, iov, iovcnt);
  msghdr m{};
  m.msg_iov = const_cast<iovec*>(iov);
  m.msg_iovlen = size_t(iovcnt);
  return recv_udp(fd, info, &m, 0);
}

// _FORTIFY_SOURCE variants: the same checks glibc makes, then the calls above.
[[noreturn]] void __chk_fail(void);

ssize_t __recv_chk(int fd, void* buf, size_t len, size_t buflen, int flags) {
  if (len > buflen) __chk_fail();
  return shim_recv_buf(fd, buf, len, flags, nullptr, nullptr);
}

ssize_t __recvfrom_chk(int fd, void* buf, size_t len, size_t buflen, int flags, sockaddr* from, socklen_t* fromlen) {
  if (len > buflen) __chk_fail();
  return shim_recv_buf(fd, buf, len, flags, from, fromlen);
}

ssize_t __read_chk(int fd, void* buf, size_t len, size_t buflen) {
  if (len > buflen) __chk_fail();
  return read(fd, buf, len);
}

// New descriptors: a number the shim remembered as not UDP may now be a UDP socket.
int socket(int domain, int type, int protocol) {
  const int fd = real().socket(domain, type, protocol);
  forget_fd(fd);
  return fd;
}

int dup(int fd) {
  const int n = real().dup(fd);
  forget_fd(n);
  return n;
}

int dup2(int fd, int to) {
  const int n = real().dup2(fd, to);
  forget_fd(n);
  return n;
}

int dup3(int fd, int to, int flags) {
  const int n = real().dup3(fd, to, flags);
  forget_fd(n);
  return n;
}

// fcntl's third argument, whatever its type, travels as one word (as glibc's own fcntl passes it on).
#define SLOTSTREAM_FCNTL(name)                                              \
  int name(int fd, int cmd, ...) {                                          \
    va_list ap;                                                             \
    va_start(ap, cmd);                                                      \
    void* arg = va_arg(ap, void*);                                          \
    va_end(ap);                                                             \
    const int r = real().name(fd, cmd, arg);                                \
    if (r >= 0 && (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC)) forget_fd(r); \
    return r;                                                               \
  }
SLOTSTREAM_FCNTL(fcntl)
SLOTSTREAM_FCNTL(fcntl64)
#undef SLOTSTREAM_FCNTL

int connect(int fd, const sockaddr* addr, socklen_t len) {
  int rc = real().connect(fd, addr, len);
  forget_peer(fd);  // a new peer (or none, with AF_UNSPEC)
  return rc;
}

}  // extern "C"
