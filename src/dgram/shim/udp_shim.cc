// libslotstream_udp.so: the patent's socket interface ("iWARP Socket Interface"): preloaded into an
// unmodified program (LD_PRELOAD), it overrides the data calls on its UDP sockets — not their
// creation ("this embodiment does not override the creation of sockets, only the data operations
// related to them") — so that every datagram travels in the datagram RDMA format: one UD Send
// segment (queue 0, the socket's own MSN, MO 0, last) with its CRC32C trailer (dgram/wire.h).
//
// The program keeps its real file descriptor, so poll/select/epoll, fork, dup2, O_NONBLOCK and
// socket options work as before. On send the payload is gathered behind the header with no copy;
// on receive the whole datagram is read into a per-thread buffer, checked (CRC first) and its
// payload copied out. A datagram that fails is dropped as the kernel drops one with a bad UDP
// checksum: a blocking call waits for the next datagram, a non-blocking one returns EAGAIN.
// MSG_PEEK, MSG_TRUNC (in and out), MSG_DONTWAIT are honoured; a payload that no longer fits one
// datagram with the headers fails with EMSGSIZE.
//
// Covered: send, sendto, sendmsg, sendmmsg, write, writev; recv, recvfrom, recvmsg, recvmmsg,
// read, readv, and the fortified __recv_chk, __recvfrom_chk, __read_chk. Not covered (they go to
// the kernel unchanged): sendfile/splice into a UDP socket, and calls glibc makes internally
// (e.g. stdio on a socket).
//
// A CRC is not authentication: anyone who can reach the program's port can send it a datagram with
// a right CRC, and it is delivered. With SLOTSTREAM_UDP_KEY_FILE (the same file for every program
// that talks to each other) every datagram also carries a MAC (dgram/mac.h: HMAC-SHA256 under a key
// derived from the file) and one without a right MAC is dropped (counted: dropped_auth); a
// datagram with a MAC reaching a program without the key is dropped too. A whole datagram captured
// on the way can still be replayed (there is no session to number them in).
//
// Environment:
//   SLOTSTREAM_UDP_KEY_FILE       a shared secret (the file's contents, trailing whitespace removed):
//                                 sign every datagram and accept only signed ones
//   SLOTSTREAM_UDP_PORTS          which datagrams: "5000-5999,8000" (either end's port); default
//                                 every one except port 53; "all" (dgram/shim/ports.h)
//   SLOTSTREAM_UDP_LOG            "1": counters on stderr at exit; a path: appended there
//   SLOTSTREAM_UDP_INJECT_LOSS    percent of sent datagrams dropped (tests; seeded)
//   SLOTSTREAM_UDP_INJECT_CORRUPT percent of sent datagrams with one bit flipped after the CRC
//   SLOTSTREAM_UDP_INJECT_DUPLICATE percent sent twice
//   SLOTSTREAM_UDP_INJECT_SEED    seed (default 1)
// A malformed setting stops the program at start with the reason (nothing is silently unwrapped).
#include <dlfcn.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "dgram/crc32c.h"
#include "dgram/injector.h"
#include "dgram/mac.h"
#include "dgram/shim/ports.h"
#include "dgram/wire.h"

using namespace slotstream::dgram;

namespace {

// ------------------------------------------------------------------ the functions we wrap

template <class F>
F next(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
}

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
};

Real& real() {
  static Real r;  // thread-safe initialisation (C++11 statics)
  return r;
}

// ------------------------------------------------------------------ configuration and counters

struct Counters {
  std::atomic<uint64_t> wrapped{0}, unwrapped{0}, passed{0}, dropped_crc{0}, dropped_malformed{0}, dropped_auth{0},
      emsgsize{0}, injected_loss{0}, injected_corrupt{0}, injected_duplicate{0};
};

struct Config {
  PortSet ports;
  InjectOptions inject;
  std::string log;
  bool keyed = false;
  MacKey key{};
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
  return c;
}

Config& config() {
  static Config c = load_config();
  return c;
}
Counters g_counters;
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
  // Programs that never touched a UDP socket (shells, helpers a program starts) say nothing.
  if (k.wrapped + k.unwrapped + k.passed + k.dropped_crc + k.dropped_malformed + k.dropped_auth + k.emsgsize == 0)
    return;
  char line[512];
  int n = std::snprintf(line, sizeof line,
                        "slotstream_udp pid=%d wrapped=%llu unwrapped=%llu passed=%llu dropped_crc=%llu "
                        "dropped_malformed=%llu dropped_auth=%llu emsgsize=%llu injected_loss=%llu "
                        "injected_corrupt=%llu injected_duplicate=%llu\n",
                        int(getpid()), (unsigned long long)k.wrapped.load(), (unsigned long long)k.unwrapped.load(),
                        (unsigned long long)k.passed.load(), (unsigned long long)k.dropped_crc.load(),
                        (unsigned long long)k.dropped_malformed.load(), (unsigned long long)k.dropped_auth.load(),
                        (unsigned long long)k.emsgsize.load(), (unsigned long long)k.injected_loss.load(),
                        (unsigned long long)k.injected_corrupt.load(), (unsigned long long)k.injected_duplicate.load());
  if (n <= 0) return;
  int fd = c.log == "1" ? STDERR_FILENO : ::open(c.log.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return;
  if (real().write(fd, line, size_t(n)) < 0) { /* nowhere left to say it */
  }
  if (fd != STDERR_FILENO) ::close(fd);
}

// ------------------------------------------------------------------ which descriptors

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
};

constexpr int kTracked = 65536;
std::mutex g_fd_mu;
std::vector<SocketInfo>& table() {
  static std::vector<SocketInfo> t(kTracked);
  return t;
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

// Fills *out and returns true if fd is a UDP socket (IPv4 or IPv6).
bool classify(int fd, SocketInfo* out) {
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
  SocketInfo fresh;
  SocketInfo* e = &fresh;
  std::unique_lock lock(g_fd_mu, std::defer_lock);
  if (fd < kTracked) {
    lock.lock();
    e = &table()[fd];
  }
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
    static std::atomic<uint32_t> counter{0};
    e->qp = uint32_t(getpid()) << 12 ^ ++counter;
  }
  if (e->udp) {
    sockaddr_storage ss{};
    socklen_t l = sizeof ss;
    if (e->local_port == 0 && getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &l) == 0) e->local_port = port_of(ss);
    if (!e->peer_known) {
      l = sizeof ss;
      e->peer_known = true;
      e->peer_port = getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &l) == 0 ? port_of(ss) : 0;
    }
  }
  *out = *e;
  return e->udp;
}

uint32_t next_msn(int fd) {
  if (fd >= kTracked) return 0;
  std::lock_guard lock(g_fd_mu);
  return table()[fd].msn++;
}

void forget_peer(int fd) {
  if (fd < 0 || fd >= kTracked) return;
  std::lock_guard lock(g_fd_mu);
  table()[fd].peer_known = false;
  table()[fd].local_port = 0;  // connect() may bind
}

size_t max_payload(int family) {
  const size_t udp_max = family == AF_INET6 ? 65527 : kMaxUdpPayload;
  return udp_max - kCommonSize - kUntaggedSize - kCrcSize - (config().keyed ? kMacTagSize : 0);
}

size_t iov_total(const iovec* iov, size_t n) {
  size_t t = 0;
  for (size_t i = 0; i < n; ++i) t += iov[i].iov_len;
  return t;
}

// ------------------------------------------------------------------ send

// Writes the trailer of a datagram (header, then msg's payload): the MAC when keyed, then the CRC
// over all of it. Returns the MAC's size (0 without a key).
size_t seal(std::span<const std::byte> header, const msghdr* msg, std::byte* trailer) {
  auto part = [&](size_t i) {
    return std::span(static_cast<const std::byte*>(msg->msg_iov[i].iov_base), msg->msg_iov[i].iov_len);
  };
  size_t tag = 0;
  if (SegmentMac* m = mac()) {
    m->start();
    m->add(header);
    for (size_t i = 0; i < msg->msg_iovlen; ++i) m->add(part(i));
    m->finish(std::span<std::byte, kMacTagSize>(trailer, kMacTagSize));
    tag = kMacTagSize;
  }
  uint32_t crc = crc32c(header);
  for (size_t i = 0; i < msg->msg_iovlen; ++i) crc = crc32c_extend(crc, part(i));
  if (tag) crc = crc32c_extend(crc, std::span<const std::byte>(trailer, tag));
  put_crc(crc, std::span<std::byte, kCrcSize>(trailer + tag, kCrcSize));
  return tag;
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
  SegmentHeader h;
  h.service = Service::kUD;
  h.opcode = Opcode::kSend;
  h.last = true;
  h.source_qp = info.qp;
  h.queue = 0;
  h.msn = next_msn(fd);
  h.offset = 0;
  h.has_mac = config().keyed;
  std::byte header[kCommonSize + kUntaggedSize];
  const size_t hs = encode_header(h, len, header);
  // Trailer: [MAC over header and payload] CRC over everything before it.
  std::byte trailer[kMacTagSize + kCrcSize];
  const size_t tag = seal(std::span(header, hs), msg, trailer);

  Injector::Verdict v;
  if (config().inject.any()) {
    std::lock_guard lock(g_inject_mu);
    v = injector().next(hs + len + tag + kCrcSize);
  }
  if (v.drop) {
    ++g_counters.injected_loss;
    ++g_counters.wrapped;
    return ssize_t(len);  // "sent": the network lost it
  }
  std::vector<iovec> iov(msg->msg_iovlen + 2);
  iov[0] = {header, hs};
  for (size_t i = 0; i < msg->msg_iovlen; ++i) iov[i + 1] = msg->msg_iov[i];
  iov[msg->msg_iovlen + 1] = {trailer, tag + kCrcSize};
  msghdr m = *msg;
  m.msg_iov = iov.data();
  m.msg_iovlen = iov.size();
  std::vector<std::byte> flat;
  iovec one;
  if (v.flip_bit >= 0) {
    // Corrupt a copy after the CRC was computed: the receiver must catch it.
    for (const iovec& x : iov) {
      auto* p = static_cast<const std::byte*>(x.iov_base);
      flat.insert(flat.end(), p, p + x.iov_len);
    }
    Injector::corrupt(flat, v);
    one = {flat.data(), flat.size()};
    m.msg_iov = &one;
    m.msg_iovlen = 1;
    ++g_counters.injected_corrupt;
  }
  ssize_t n = real().sendmsg(fd, &m, flags);
  if (n < 0) return n;
  if (v.duplicate) {
    ++g_counters.injected_duplicate;
    (void)real().sendmsg(fd, &m, flags | MSG_DONTWAIT);
  }
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

std::byte* rx_buffer() {
  thread_local std::vector<std::byte> buf(65536);
  return buf.data();
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

ssize_t shim_recvmsg(int fd, msghdr* msg, int flags) {
  SocketInfo info;
  if ((flags & MSG_ERRQUEUE) || !classify(fd, &info)) return real().recvmsg(fd, msg, flags);
  std::byte* buf = rx_buffer();
  for (;;) {
    sockaddr_storage from{};
    iovec iov{buf, 65536};
    msghdr m = *msg;
    m.msg_name = &from;
    m.msg_namelen = sizeof from;
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_flags = 0;
    // The whole datagram, always (the CRC covers all of it); MSG_TRUNC is answered below.
    const ssize_t n = real().recvmsg(fd, &m, flags & ~MSG_TRUNC);
    if (n < 0) return n;
    auto finish = [&](const std::byte* payload, size_t len) -> ssize_t {
      const size_t room = iov_total(msg->msg_iov, msg->msg_iovlen);
      const size_t copied = scatter(payload, len, msg->msg_iov, msg->msg_iovlen);
      if (msg->msg_name) {
        std::memcpy(msg->msg_name, &from, std::min<size_t>(msg->msg_namelen, m.msg_namelen));
      }
      msg->msg_namelen = m.msg_namelen;
      msg->msg_controllen = m.msg_controllen;
      msg->msg_flags = (m.msg_flags & ~MSG_TRUNC) | (len > room ? MSG_TRUNC : 0);
      return (flags & MSG_TRUNC) ? ssize_t(len) : ssize_t(copied);
    };
    if (info.local_port == 0) {
      sockaddr_storage ss{};
      socklen_t l = sizeof ss;
      if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &l) == 0) info.local_port = port_of(ss);
    }
    if (!config().ports.applies(info.local_port, port_of(from))) {
      if (!(flags & MSG_PEEK)) ++g_counters.passed;
      return finish(buf, size_t(n));
    }
    DecodeError why;
    auto seg = decode_segment(std::span(buf, size_t(n)), &why);
    const bool ours = seg && seg->header.service == Service::kUD && seg->header.opcode == Opcode::kSend &&
                      seg->header.last && seg->header.offset == 0 && seg->header.queue == 0;
    // With a key only signed datagrams count; without one, a signed datagram cannot be checked.
    const bool genuine = ours && (mac() ? mac()->verify(*seg) : !seg->header.has_mac);
    if (genuine) {
      if (!(flags & MSG_PEEK)) ++g_counters.unwrapped;
      return finish(seg->payload.data(), seg->payload.size());
    }
    // Dropped like a datagram with a bad UDP checksum. A peeked one must still be taken off the queue.
    ++(ours                       ? g_counters.dropped_auth
       : why == DecodeError::kCrc ? g_counters.dropped_crc
                                  : g_counters.dropped_malformed);
    if (flags & MSG_PEEK) {
      iovec skip{buf, 65536};
      msghdr d{};
      d.msg_iov = &skip;
      d.msg_iovlen = 1;
      (void)real().recvmsg(fd, &d, MSG_DONTWAIT);
    }
  }
}

ssize_t shim_recv_buf(int fd, void* buf, size_t len, int flags, sockaddr* from, socklen_t* fromlen) {
  iovec iov{buf, len};
  msghdr m{};
  m.msg_name = from;
  m.msg_namelen = from && fromlen ? *fromlen : 0;
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  ssize_t n = shim_recvmsg(fd, &m, flags);
  if (n >= 0 && from && fromlen) *fromlen = m.msg_namelen;
  return n;
}

}  // namespace

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
  if (!classify(fd, &info)) return real().recvmmsg(fd, vec, vlen, flags, timeout);
  // The first datagram as asked (blocking unless MSG_DONTWAIT); the rest only if already there.
  unsigned i = 0;
  for (; i < vlen; ++i) {
    ssize_t n = shim_recvmsg(fd, &vec[i].msg_hdr, i == 0 ? (flags & ~MSG_WAITFORONE) : (flags | MSG_DONTWAIT));
    if (n < 0) {
      if (i == 0) return -1;
      break;
    }
    vec[i].msg_len = unsigned(n);
  }
  return int(i);
}

ssize_t read(int fd, void* buf, size_t len) {
  SocketInfo info;
  if (!classify(fd, &info)) return real().read(fd, buf, len);
  return shim_recv_buf(fd, buf, len, 0, nullptr, nullptr);
}

ssize_t readv(int fd, const iovec* iov, int iovcnt) {
  SocketInfo info;
  if (!classify(fd, &info)) return real().readv(fd, iov, iovcnt);
  msghdr m{};
  m.msg_iov = const_cast<iovec*>(iov);
  m.msg_iovlen = size_t(iovcnt);
  return shim_recvmsg(fd, &m, 0);
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

int connect(int fd, const sockaddr* addr, socklen_t len) {
  int rc = real().connect(fd, addr, len);
  forget_peer(fd);  // a new peer (or none, with AF_UNSPEC)
  return rc;
}

}  // extern "C"
