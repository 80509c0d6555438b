// The preload shim's table of descriptors: which are UDP sockets (checked by inode, so that a number reused for
// another file is never taken for the old socket; numbers known not to be UDP cost no system call), each
// socket's source QP, MSN, ports and GSO state, its receive side (shared by dup()ed descriptors), and fork.
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include "engine/dgram/shim/internal.h"

namespace slotstream::dgram::shim {

// A socket's receive side in the shim: large datagrams being recombined, and those finished but not yet
// read. Made with the first segment, so that a socket that only ever gets small datagrams costs nothing.
std::atomic<int> g_rx_states{0};

namespace {

// Descriptors 0..kTracked-1 are tracked, in chunks made when one of their descriptors is first seen: a
// process pays for the descriptors it uses (64 B each), not for all 65,536 entries up front (4 MiB of every
// shimmed process, what `bench sipscale` measured before).
constexpr int kTracked = 65536;
constexpr int kChunk = 256;
static_assert(kTracked % kChunk == 0);
std::mutex g_fd_mu;
int g_table_top = 0;  // entries [0, top) have been used (g_fd_mu)
std::array<std::unique_ptr<SocketInfo[]>, kTracked / kChunk>& chunks() {
  static std::array<std::unique_ptr<SocketInfo[]>, kTracked / kChunk> c;
  return c;
}
// The entry of descriptor fd, 0 <= fd < kTracked, its chunk made if need be. Caller holds g_fd_mu.
SocketInfo& tracked(int fd) {
  auto& chunk = chunks()[size_t(fd) / kChunk];
  if (!chunk) chunk = std::make_unique<SocketInfo[]>(kChunk);
  return chunk[size_t(fd) % kChunk];
}

// A socket's source QP: with the sender's address, what tells its datagrams from others' at the receiving shim.
uint32_t new_qp() {
  static std::atomic<uint32_t> counter{0};
  return uint32_t(getpid()) << 12 ^ ++counter;
}

// After fork, parent and child number their datagrams on an inherited socket independently (each its own MSN):
// the child's sockets get QPs of their own, or a receiver would take the child's datagrams for the parent's
// (one MSN, two messages). The table is locked across fork so that the child finds it consistent.
void fork_prepare() { g_fd_mu.lock(); }
void fork_parent() { g_fd_mu.unlock(); }
void fork_child() {
  g_fd_mu.unlock();
  for (int fd = 0; fd < g_table_top; ++fd) {
    const auto& chunk = chunks()[size_t(fd) / kChunk];
    if (!chunk) continue;  // no descriptor of this chunk was ever seen
    SocketInfo& e = chunk[size_t(fd) % kChunk];
    if (e.udp) {
      e.qp = new_qp();
      e.msn = 0;
    }
  }
}

__attribute__((constructor)) void shim_fork_handlers() { pthread_atfork(fork_prepare, fork_parent, fork_child); }

// Receive state by socket (device, inode): descriptors dup()ed from one socket share its kernel queue, so they
// share what the shim took off it — segments read through one and the rest through another make one datagram.
// The caller holds g_fd_mu. With `make`, made if the socket has none.
std::shared_ptr<RxState> socket_rx(dev_t dev, ino_t ino, bool make) {
  static std::map<std::pair<dev_t, ino_t>, std::weak_ptr<RxState>> by_socket;
  if (const auto it = by_socket.find({dev, ino}); it != by_socket.end()) {
    if (auto rx = it->second.lock()) return rx;
  }
  if (!make) return nullptr;
  std::erase_if(by_socket, [](const auto& kv) { return kv.second.expired(); });
  auto rx = std::make_shared<RxState>();
  by_socket[{dev, ino}] = rx;
  return rx;
}

}  // namespace

uint16_t port_of(const sockaddr_storage& ss) {
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(ss).sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(ss).sin6_port);
  return 0;
}
uint16_t port_of(const void* sa, socklen_t len) {
  if (!sa || len < socklen_t(sizeof(sa_family_t))) return 0;
  sockaddr_storage ss{};
  std::memcpy(&ss, sa, std::min<size_t>(len, sizeof ss));
  return port_of(ss);
}

namespace {

// Descriptor numbers known not to be a UDP socket (pipes, files, TCP and AF_UNIX sockets), so that the calls the
// shim wraps cost them no system call (an fstat per poll wakeup and per read/write was a third to two thirds of
// the call: docs/benchmarks.md). Bit 0: not UDP; the bits above: a generation, so that a descriptor forgotten
// while another thread was looking at it is not remembered wrongly. Only "not UDP" is kept: a number can become
// a UDP socket only through socket(), dup/dup2/dup3/fcntl(F_DUPFD) or SCM_RIGHTS, and those forget it; a UDP
// socket is still checked by inode at every call, so a number reused for a file is never taken for the socket.
std::atomic<uint32_t> g_not_udp[kTracked];

// Remembers fd, looked at under generation `seen`, as not a UDP socket; returns false.
bool remember_not_udp(int fd, uint32_t seen) {
  if (fd < kTracked) g_not_udp[fd].compare_exchange_strong(seen, seen | 1, std::memory_order_release);
  return false;
}

}  // namespace

// fd is a new descriptor (or a new object at its number).
void forget_fd(int fd) {
  if (fd < 0 || fd >= kTracked) return;
  uint32_t v = g_not_udp[fd].load(std::memory_order_relaxed);
  while (!g_not_udp[fd].compare_exchange_weak(v, (v | 1) + 1, std::memory_order_release)) {
  }
}

namespace {

// The table's entry for a socket (made afresh when the inode changed); g_fd_mu held where fd < kTracked.
void socket_entry(int fd, const struct stat& st, SocketInfo* e) {
  if (e->ino != st.st_ino || e->dev != st.st_dev || e->ino == 0) {
    *e = SocketInfo{};
    e->dev = st.st_dev;
    e->ino = st.st_ino;
    int type = 0, proto = 0, domain = 0;
    socklen_t l = sizeof(int);
    getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &l);
    l = sizeof(int);
    getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &l);
    l = sizeof(int);
    getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &l);
    e->udp = type == SOCK_DGRAM && proto == IPPROTO_UDP && (domain == AF_INET || domain == AF_INET6);
    e->family = domain;
    e->qp = new_qp();
  }
  if (!e->udp) return;
  sockaddr_storage ss{};
  socklen_t l = sizeof ss;
  if (e->local_port == 0 && getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &l) == 0) e->local_port = port_of(ss);
  if (!e->peer_known) {
    l = sizeof ss;
    e->peer_known = true;
    e->peer_port = getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &l) == 0 ? port_of(ss) : 0;
  }
}

}  // namespace

// Fills *out and returns true if fd is a UDP socket (IPv4 or IPv6).
bool classify(int fd, SocketInfo* out) {
  if (fd < 0) return false;
  const uint32_t seen = fd < kTracked ? g_not_udp[fd].load(std::memory_order_acquire) : 0;
  if (seen & 1) return false;
  struct stat st;
  if (fstat(fd, &st) != 0) return false;
  if (!S_ISSOCK(st.st_mode)) return remember_not_udp(fd, seen);
  if (fd >= kTracked) {
    SocketInfo fresh;
    socket_entry(fd, st, &fresh);
    *out = fresh;
    return fresh.udp;
  }
  std::lock_guard lock(g_fd_mu);
  SocketInfo& e = tracked(fd);
  g_table_top = std::max(g_table_top, fd + 1);
  socket_entry(fd, st, &e);
  if (!e.udp) return remember_not_udp(fd, seen);
  // Another descriptor of this socket may have receive state already (a dup).
  if (!e.rx && g_rx_states.load(std::memory_order_relaxed) > 0) e.rx = socket_rx(e.dev, e.ino, false);
  *out = e;
  return true;
}

uint32_t next_msn(int fd) {
  if (fd < 0 || fd >= kTracked) return 0;
  std::lock_guard lock(g_fd_mu);
  return tracked(fd).msn++;
}

void forget_peer(int fd) {
  if (fd < 0 || fd >= kTracked) return;
  std::lock_guard lock(g_fd_mu);
  tracked(fd).peer_known = false;
  tracked(fd).local_port = 0;  // connect() may bind
}

// Records whether fd's kernel segments its datagrams (UDP_SEGMENT), in *info and the table; a refusal is counted.
void remember_gso(int fd, SocketInfo* info, bool usable) {
  info->gso = usable ? GsoState::kUsable : GsoState::kRefused;
  if (!usable) ++g_counters.gso_refused;
  if (fd < 0 || fd >= kTracked) return;
  std::lock_guard lock(g_fd_mu);
  SocketInfo& e = tracked(fd);
  if (e.ino == info->ino && e.dev == info->dev) e.gso = info->gso;
}

// The state of fd's receive side, made if need be; nullptr for descriptors past the table.
std::shared_ptr<RxState> rx_state(int fd, SocketInfo* info) {
  if (info->rx || fd < 0 || fd >= kTracked) return info->rx;
  std::lock_guard lock(g_fd_mu);
  SocketInfo& e = tracked(fd);
  if (e.ino == info->ino && e.dev == info->dev) {
    if (!e.rx) e.rx = socket_rx(info->dev, info->ino, true);
    info->rx = e.rx;
  }
  return info->rx;
}

}  // namespace slotstream::dgram::shim
