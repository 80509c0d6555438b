// What the preload shim's own files share (internal to libslotstream_udp.so; hidden from the programs it is
// preloaded into): the libc functions it stands in front of, its configuration and counters (config.cc), its
// table of descriptors (fd_table.cc), the send path (send.cc) and the receive path (receive.cc) that the libc
// wrappers (udp_shim.cc) call.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include "clock.h"
#include "engine/dgram/llp/injector.h"
#include "engine/dgram/shim/ports.h"
#include "engine/dgram/shim/reassembly.h"
#include "engine/dgram/shim/shim.h"
#include "engine/dgram/wire/mac.h"

#pragma GCC visibility push(hidden)

namespace slotstream::dgram::shim {

// ------------------------------------------------------------------ the functions we wrap

struct Real {
  decltype(&::sendmsg) sendmsg = next<decltype(&::sendmsg)>("sendmsg");
  decltype(&::recvmsg) recvmsg = next<decltype(&::recvmsg)>("recvmsg");
  decltype(&::sendto) sendto = next<decltype(&::sendto)>("sendto");
  decltype(&::recvfrom) recvfrom = next<decltype(&::recvfrom)>("recvfrom");
  decltype(&::send) send = next<decltype(&::send)>("send");
  decltype(&::recv) recv = next<decltype(&::recv)>("recv");
  decltype(&::write) write = next<decltype(&::write)>("write");
  decltype(&::read) read = next<decltype(&::read)>("read");
  decltype(&::writev) writev = next<decltype(&::writev)>("writev");
  decltype(&::readv) readv = next<decltype(&::readv)>("readv");
  int (*sendmmsg)(int, mmsghdr*, unsigned, int) = next<int (*)(int, mmsghdr*, unsigned, int)>("sendmmsg");
  int (*recvmmsg)(int, mmsghdr*, unsigned, int,
                  timespec*) = next<int (*)(int, mmsghdr*, unsigned, int, timespec*)>("recvmmsg");
  decltype(&::connect) connect = next<decltype(&::connect)>("connect");
  decltype(&::poll) poll = next<decltype(&::poll)>("poll");
  decltype(&::socket) socket = next<decltype(&::socket)>("socket");
  decltype(&::dup) dup = next<decltype(&::dup)>("dup");
  decltype(&::dup2) dup2 = next<decltype(&::dup2)>("dup2");
  decltype(&::dup3) dup3 = next<decltype(&::dup3)>("dup3");
  int (*fcntl)(int, int, ...) = next<int (*)(int, int, ...)>("fcntl");
  int (*fcntl64)(int, int, ...) = next<int (*)(int, int, ...)>("fcntl64");
};

inline Real& real() {
  static Real r;  // thread-safe initialisation (C++11 statics)
  return r;
}

// ------------------------------------------------------------------ configuration and counters (config.cc)

// wrapped/unwrapped: application datagrams sent and delivered (large ones once each); large: those sent
// as Write-Record, in `segments` segments; segments_in: segments received; dropped_plain: datagrams without
// the shim's magic (SLOTSTREAM_UDP_PLAIN=drop), plain_accepted: delivered as they are; gso_messages: messages handed
// to the kernel with UDP_SEGMENT, carrying gso_segments segments; gso_refused: sockets whose kernel refused it.
struct Counters {
  std::atomic<uint64_t> gso_messages{0}, gso_segments{0}, gso_refused{0};
  std::atomic<uint64_t> wrapped{0}, unwrapped{0}, passed{0}, large{0}, segments{0}, segments_in{0}, dropped_crc{0},
      dropped_malformed{0}, dropped_auth{0}, dropped_plain{0}, plain_accepted{0}, emsgsize{0}, injected_loss{0},
      injected_corrupt{0}, injected_duplicate{0};
};

struct Config {
  PortSet ports;
  InjectOptions inject;
  std::string log;
  bool keyed = false;
  MacKey key{};
  size_t mtu = 1500;
  bool plain_accept = false;
  bool gso = true;
  ReassemblyOptions reassembly;
};

// The settings from the environment; a malformed one stops the program with the reason.
Config load_config();

inline Config& config() {
  static Config c = load_config();
  return c;
}
extern Counters g_counters;
extern ReassemblyCounters g_reassembly;

// This thread's MAC (an OpenSSL context is for one thread at a time); nullptr without a key.
SegmentMac* mac();

// ------------------------------------------------------------------ which descriptors (fd_table.cc)

// A socket's receive side in the shim: large datagrams being recombined, and those finished but not yet
// read. Made with the first segment, so that a socket that only ever gets small datagrams costs nothing.
extern std::atomic<int> g_rx_states;  // RxStates alive (fd_table.cc)

struct RxState {
  RxState() { ++g_rx_states; }
  ~RxState() { --g_rx_states; }
  RxState(const RxState&) = delete;
  RxState& operator=(const RxState&) = delete;
  std::mutex mu;
  Reassembly reassembly{config().reassembly, &g_reassembly};
  std::deque<ShimDatagram> ready;
};

// Whether the kernel segments this socket's datagrams (UDP_SEGMENT): asked once, remembered once refused.
enum class GsoState : uint8_t { kUnknown, kUsable, kRefused };

// What we know about a UDP socket, keyed by its inode so that a descriptor number reused for
// another file (after a close we did not see) is never mistaken for the old socket.
struct SocketInfo {
  dev_t dev = 0;
  ino_t ino = 0;
  bool udp = false;
  int family = 0;
  uint16_t local_port = 0;
  uint16_t peer_port = 0;
  bool peer_known = false;
  uint32_t qp = 0;
  uint32_t msn = 0;
  GsoState gso = GsoState::kUnknown;
  std::shared_ptr<RxState> rx;
};

// Fills *out and returns true if fd is a UDP socket (IPv4 or IPv6).
bool classify(int fd, SocketInfo* out);
// fd is a new descriptor (or a new object at its number).
void forget_fd(int fd);
// fd's peer (and local port) may have changed: learnt again at its next call.
void forget_peer(int fd);
// The next MSN of fd's datagrams.
uint32_t next_msn(int fd);
// Records whether fd's kernel segments its datagrams (UDP_SEGMENT), in *info and the table; a refusal is counted.
void remember_gso(int fd, SocketInfo* info, bool usable);
// The state of fd's receive side, made if need be; nullptr for descriptors past the table.
std::shared_ptr<RxState> rx_state(int fd, SocketInfo* info);
uint16_t port_of(const sockaddr_storage& ss);
uint16_t port_of(const void* sa, socklen_t len);

inline size_t iov_total(const iovec* iov, size_t n) {
  size_t t = 0;
  for (size_t i = 0; i < n; ++i) t += iov[i].iov_len;
  return t;
}

// Milliseconds poll() should wait to reach `deadline_ns` (rounded up, so that the deadline has passed).
inline int ms_until(int64_t deadline_ns) {
  const int64_t left = deadline_ns - now_ns();
  if (left <= 0) return 0;
  return int(std::min<int64_t>((left + 999'999) / 1'000'000, 1 << 30));
}

// ------------------------------------------------------------------ send (send.cc)

// sendmsg on any descriptor: a UDP socket's datagram wrapped, anything else passed to libc.
ssize_t shim_sendmsg(int fd, const msghdr* msg, int flags);
ssize_t shim_send_buf(int fd, const void* buf, size_t len, int flags, const sockaddr* to, socklen_t tolen);

// ------------------------------------------------------------------ receive (receive.cc)

// recvmsg on a UDP socket the caller classified (`info`): each wrapper classifies once.
ssize_t recv_udp(int fd, SocketInfo& info, msghdr* msg, int flags);
ssize_t shim_recvmsg(int fd, msghdr* msg, int flags);
// recv/recvfrom/read: one buffer. `info`: the socket, classified by the caller, or nullptr.
ssize_t shim_recv_buf(int fd, void* buf, size_t len, int flags, sockaddr* from, socklen_t* fromlen,
                      SocketInfo* info = nullptr);
int shim_recvmmsg(int fd, SocketInfo& info, mmsghdr* vec, unsigned vlen, int flags, timespec* timeout);
// Descriptors another process passed (SCM_RIGHTS): new numbers, which may be UDP sockets.
void forget_passed(const msghdr* msg);

}  // namespace slotstream::dgram::shim

#pragma GCC visibility pop
