// libslotstream_udp.so: the patent's socket interface ("iWARP Socket Interface"): preloaded into an
// unmodified program (LD_PRELOAD), it overrides the data calls on its UDP sockets — not their
// creation ("this embodiment does not override the creation of sockets, only the data operations
// related to them") — so that every application datagram travels as one datagram RDMA message:
//
//   - one that fits one MTU-sized datagram with its headers: one UD Send segment (queue 0, the socket's
//     own MSN, MO 0, last) with its CRC32C trailer (dgram/wire.h) — 28 bytes more;
//   - a larger one (up to the 65,507 bytes UDP allows over IPv4, 65,527 over IPv6): one UD RDMA
//     Write-Record message in MTU-sized DDP segments (dgram/segments.h; STag kShimFirstStag + MSN mod
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
// that talks to each other) every segment also carries a MAC (dgram/mac.h: HMAC-SHA256 under a key
// derived from the file) and one without a right MAC is dropped (counted: dropped_auth); a
// datagram with a MAC reaching a program without the key is dropped too. A whole datagram captured
// on the way can still be replayed (there is no session to number them in). SLOTSTREAM_UDP_PLAIN=accept
// lets anyone's plain datagrams in, key or not.
//
// Environment:
//   SLOTSTREAM_UDP_KEY_FILE       a shared secret (the file's contents, trailing whitespace removed):
//                                 sign every segment and accept only signed ones
//   SLOTSTREAM_UDP_PORTS          which datagrams: "5000-5999,8000" (either end's port); default
//                                 every one except port 53; "all" (dgram/shim/ports.h)
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
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "dgram/crc32c.h"
#include "dgram/injector.h"
#include "dgram/mac.h"
#include "dgram/segments.h"
#include "dgram/shim/gso.h"
#include "dgram/shim/ports.h"
#include "dgram/shim/reassembly.h"
#include "dgram/shim/shim.h"
#include "dgram/wire.h"
#include "dgram/write_record.h"

using namespace slotstream::dgram;
using shim::next;

namespace {

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

Real& real() {
  static Real r;  // thread-safe initialisation (C++11 statics)
  return r;
}

// ------------------------------------------------------------------ configuration and counters

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

[[noreturn]] void die(const std::string& why) {
  std::fprintf(stderr, "slotstream_udp: %s; stopping (fix the environment or unset it)\n", why.c_str());
  std::fflush(stderr);
  _exit(2);
}

// SLOTSTREAM_UDP_KEY_FILE's contents without trailing whitespace (what net::read_token_file reads).
void load_key(const char* path, Config* c) {
  FILE* f = std::fopen(path, "rb");
  if (!f) die(std::string("cannot read SLOTSTREAM_UDP_KEY_FILE '") + path + "': " + std::strerror(errno));
  std::string token;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) token.append(buf, n);
  std::fclose(f);
  while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back()))) token.pop_back();
  if (token.empty()) die(std::string("SLOTSTREAM_UDP_KEY_FILE '") + path + "' is empty");
  c->keyed = true;
  c->key = shim_key(token);
}

// A whole number lo..hi from the environment, or `fallback` when unset.
long env_number(const char* name, long lo, long hi, long fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(v, &end, 10);
  if (errno || *end || n < lo || n > hi) {
    die(std::string(name) + " expects a whole number " + std::to_string(lo) + ".." + std::to_string(hi) + ", got '" +
        v + "'");
  }
  return n;
}

// One of two words from the environment: true for `yes`, false for `no` (and when unset).
bool env_choice(const char* name, const char* yes, const char* no) {
  const char* v = std::getenv(name);
  if (!v || !*v || std::strcmp(v, no) == 0) return false;
  if (std::strcmp(v, yes) == 0) return true;
  die(std::string(name) + " expects '" + yes + "' or '" + no + "', got '" + v + "'");
}

void load_recombination(Config* c) {
  c->mtu = size_t(env_number("SLOTSTREAM_UDP_MTU", 576, 65535, 1500));
  c->reassembly.timeout_ns = env_number("SLOTSTREAM_UDP_REASSEMBLY_MS", 1, 600000, 200) * 1'000'000;
  c->reassembly.deliver_partial = env_choice("SLOTSTREAM_UDP_PARTIAL", "deliver", "drop");
  c->plain_accept = env_choice("SLOTSTREAM_UDP_PLAIN", "accept", "drop");
  c->gso = !env_choice("SLOTSTREAM_UDP_GSO", "off", "on");
}

Config load_config() {
  Config c;
  std::string err;
  if (const char* k = std::getenv("SLOTSTREAM_UDP_KEY_FILE"); k && *k) load_key(k, &c);
  if (const char* p = std::getenv("SLOTSTREAM_UDP_PORTS")) {
    if (!PortSet::parse(p, &c.ports, &err)) die(err);
  }
  struct {
    const char* name;
    double* out;
  } rates[] = {{"SLOTSTREAM_UDP_INJECT_LOSS", &c.inject.loss},
               {"SLOTSTREAM_UDP_INJECT_CORRUPT", &c.inject.corrupt},
               {"SLOTSTREAM_UDP_INJECT_DUPLICATE", &c.inject.duplicate}};
  for (auto& r : rates) {
    if (const char* v = std::getenv(r.name); v && *v && !parse_percent(v, r.out)) {
      die(std::string(r.name) + " expects a percentage 0..100, got '" + v + "'");
    }
  }
  if (const char* s = std::getenv("SLOTSTREAM_UDP_INJECT_SEED")) c.inject.seed = std::strtoull(s, nullptr, 10);
  if (const char* l = std::getenv("SLOTSTREAM_UDP_LOG")) c.log = l;
  load_recombination(&c);
  return c;
}

Config& config() {
  static Config c = load_config();
  return c;
}
Counters g_counters;
ReassemblyCounters g_reassembly;
std::mutex g_inject_mu;

Injector& injector() {
  static Injector inj(config().inject);
  return inj;
}

// This thread's MAC (an OpenSSL context is for one thread at a time); nullptr without a key.
SegmentMac* mac() {
  if (!config().keyed) return nullptr;
  thread_local SegmentMac m(config().key);
  return &m;
}

__attribute__((constructor)) void shim_init() {
  (void)real();
  (void)config();  // malformed settings stop the program now, not at its first datagram
}

__attribute__((destructor)) void shim_report() {
  const Config& c = config();
  if (c.log.empty()) return;
  const Counters& k = g_counters;
  const ReassemblyCounters& r = g_reassembly;
  const std::pair<const char*, uint64_t> fields[] = {
      {"wrapped", k.wrapped},
      {"unwrapped", k.unwrapped},
      {"passed", k.passed},
      {"large", k.large},
      {"segments", k.segments},
      {"segments_in", k.segments_in},
      {"gso_messages", k.gso_messages},
      {"gso_segments", k.gso_segments},
      {"gso_refused", k.gso_refused},
      {"reassembled", r.reassembled},
      {"partial_delivered", r.partial_delivered},
      {"partial_dropped", r.partial_dropped},
      {"late_segments", r.late_segments},
      {"duplicate_segments", r.duplicate_segments},
      {"bad_segments", r.bad_segments},
      {"dropped_crc", k.dropped_crc},
      {"dropped_malformed", k.dropped_malformed},
      {"dropped_auth", k.dropped_auth},
      {"dropped_plain", k.dropped_plain},
      {"plain_accepted", k.plain_accepted},
      {"emsgsize", k.emsgsize},
      {"injected_loss", k.injected_loss},
      {"injected_corrupt", k.injected_corrupt},
      {"injected_duplicate", k.injected_duplicate},
  };
  // Programs that never touched a UDP socket (shells, helpers a program starts) say nothing.
  uint64_t any = 0;
  for (const auto& [_, v] : fields) any += v;
  if (any == 0) return;
  std::string line = "slotstream_udp pid=" + std::to_string(getpid());
  for (const auto& [name, v] : fields) line += std::string(" ") + name + "=" + std::to_string(v);
  line += "\n";
  int fd = c.log == "1" ? STDERR_FILENO : ::open(c.log.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return;
  if (real().write(fd, line.data(), line.size()) < 0) { /* nowhere left to say it */
  }
  if (fd != STDERR_FILENO) ::close(fd);
}

// ------------------------------------------------------------------ which descriptors

// A socket's receive side in the shim: large datagrams being recombined, and those finished but not yet
// read. Made with the first segment, so that a socket that only ever gets small datagrams costs nothing.
std::atomic<int> g_rx_states{0};

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

// fd is a new descriptor (or a new object at its number).
void forget_fd(int fd) {
  if (fd < 0 || fd >= kTracked) return;
  uint32_t v = g_not_udp[fd].load(std::memory_order_relaxed);
  while (!g_not_udp[fd].compare_exchange_weak(v, (v | 1) + 1, std::memory_order_release)) {
  }
}

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

size_t iov_total(const iovec* iov, size_t n) {
  size_t t = 0;
  for (size_t i = 0; i < n; ++i) t += iov[i].iov_len;
  return t;
}

int64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// Milliseconds poll() should wait to reach `deadline_ns` (rounded up, so that the deadline has passed).
int ms_until(int64_t deadline_ns) {
  const int64_t left = deadline_ns - monotonic_ns();
  if (left <= 0) return 0;
  return int(std::min<int64_t>((left + 999'999) / 1'000'000, 1 << 30));
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

// A datagram larger than one MTU: one UD RDMA Write-Record message in MTU-sized segments (dgram/segments.h,
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

// ------------------------------------------------------------------ receive

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
  st->reassembly.expire(monotonic_ns(), &st->ready);
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
  st->reassembly.feed(*seg, from, r.from_len, r.control, monotonic_ns(), &st->ready);
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
  int64_t start_ = monotonic_ns();
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
  return monotonic_ns() >= wake ? Wait::kLook : Wait::kTimedOut;
}

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
ssize_t shim_recv_buf(int fd, void* buf, size_t len, int flags, sockaddr* from, socklen_t* fromlen,
                      SocketInfo* info = nullptr) {
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
    end = monotonic_ns() + int64_t(timeout->tv_sec) * 1'000'000'000 + timeout->tv_nsec;
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
      const int64_t left = std::max<int64_t>(end - monotonic_ns(), 0);
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

namespace slotstream::dgram::shim {

int64_t now_ns() { return monotonic_ns(); }

bool any_held() { return g_rx_states.load(std::memory_order_relaxed) > 0; }

Readiness readiness(int fd, bool drain) {
  SocketInfo info;
  if (!classify(fd, &info)) return {};
  Readiness r;
  r.udp = true;
  if (info.rx) {
    std::lock_guard lock(info.rx->mu);
    info.rx->reassembly.expire(monotonic_ns(), &info.rx->ready);
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
