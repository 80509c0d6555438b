#include "engine/dgram/llp/llp.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <net/if.h>
#include <netdb.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "common.h"

namespace slotstream::dgram {
namespace {

constexpr size_t kInboxDatagram = 65536;

Status sys_error(const std::string& what, int err) {
  if (err == ECONNREFUSED) {
    return {Code::kPeerGone, what + ": nobody is listening there (port unreachable)"};
  }
  return {Code::kTransportError, what + ": " + strerror(err)};
}

void set_buffer(int fd, int force_opt, int opt, size_t bytes) {
  const int v = int(bytes);
  // SO_*BUFFORCE lets root go past net.core.[rw]mem_max; others get what the limit allows.
  if (setsockopt(fd, SOL_SOCKET, force_opt, &v, sizeof v) != 0) setsockopt(fd, SOL_SOCKET, opt, &v, sizeof v);
}

bool wait_fd(int fd, short events, int timeout_ms) {
  pollfd p{fd, events, 0};
  return poll(&p, 1, timeout_ms) > 0;
}

}  // namespace

std::string Address::str() const {
  char host[INET6_ADDRSTRLEN] = "?";
  if (ss.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr, host, sizeof host);
    return std::string(host) + ":" + std::to_string(port());
  }
  if (ss.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_addr, host, sizeof host);
    return "[" + std::string(host) + "]:" + std::to_string(port());
  }
  return "?";
}

uint16_t Address::port() const {
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&ss)->sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_port);
  return 0;
}

bool Address::operator==(const Address& o) const {
  if (ss.ss_family != o.ss.ss_family || port() != o.port()) return false;
  if (ss.ss_family == AF_INET) {
    return reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr.s_addr ==
           reinterpret_cast<const sockaddr_in*>(&o.ss)->sin_addr.s_addr;
  }
  if (ss.ss_family == AF_INET6) {
    return std::memcmp(&reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_addr,
                       &reinterpret_cast<const sockaddr_in6*>(&o.ss)->sin6_addr, sizeof(in6_addr)) == 0;
  }
  return false;
}

std::string Address::identity() const {
  std::string k(1, char(ss.ss_family));
  const uint16_t p = port();
  k.push_back(char(p & 0xFF));
  k.push_back(char(p >> 8));
  if (ss.ss_family == AF_INET) {
    const auto* a = &reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr;
    k.append(reinterpret_cast<const char*>(a), sizeof *a);
  } else if (ss.ss_family == AF_INET6) {
    const auto* a = &reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_addr;
    k.append(reinterpret_cast<const char*>(a), sizeof *a);
  }
  return k;
}

Status resolve(const std::string& host, uint16_t port, Address* out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  hints.ai_flags = AI_NUMERICSERV | (host.empty() ? AI_PASSIVE : 0);
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0 || !res) return {Code::kInvalidArgument, "cannot resolve '" + host + "': " + gai_strerror(rc)};
  const addrinfo* pick = res;
  for (const addrinfo* a = res; a; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      pick = a;
      break;
    }
  }
  std::memcpy(&out->ss, pick->ai_addr, pick->ai_addrlen);
  out->len = pick->ai_addrlen;
  freeaddrinfo(res);
  return Status::ok();
}

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.release();
  }
  return *this;
}

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

Status UdpSocket::open(const std::string& host, uint16_t port, size_t buffer_bytes, std::unique_ptr<UdpSocket>* out) {
  Address a;
  SLOTSTREAM_RETURN_IF_ERROR(resolve(host, port, &a));
  Fd fd(::socket(a.ss.ss_family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return sys_error("socket", errno);
  set_buffer(fd.get(), SO_RCVBUFFORCE, SO_RCVBUF, buffer_bytes);
  set_buffer(fd.get(), SO_SNDBUFFORCE, SO_SNDBUF, buffer_bytes);
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&a.ss), a.len) != 0) {
    const int err = errno;
    Status st = sys_error("cannot bind UDP " + a.str(), err);
    return {st.code(), st.message() + bind_error_hint(err)};
  }
  out->reset(new UdpSocket(std::move(fd)));
  return Status::ok();
}

bool is_multicast(const Address& a) {
  if (a.ss.ss_family == AF_INET) {
    return IN_MULTICAST(ntohl(reinterpret_cast<const sockaddr_in*>(&a.ss)->sin_addr.s_addr));
  }
  return a.ss.ss_family == AF_INET6 && IN6_IS_ADDR_MULTICAST(&reinterpret_cast<const sockaddr_in6*>(&a.ss)->sin6_addr);
}

namespace {

// The index of network interface `name` (0 for ""), or an error naming it.
Status interface_index(const std::string& name, unsigned* index) {
  *index = 0;
  if (name.empty()) return Status::ok();
  *index = if_nametoindex(name.c_str());
  if (*index == 0) return {Code::kInvalidArgument, "no network interface '" + name + "' (see `ip link`)"};
  return Status::ok();
}

}  // namespace

Status UdpSocket::open_group(const Address& group, const std::string& interface, size_t buffer_bytes,
                             std::unique_ptr<UdpSocket>* out) {
  unsigned ifindex = 0;
  SLOTSTREAM_RETURN_IF_ERROR(interface_index(interface, &ifindex));
  Fd fd(::socket(group.ss.ss_family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return sys_error("socket", errno);
  int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  set_buffer(fd.get(), SO_RCVBUFFORCE, SO_RCVBUF, buffer_bytes);
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&group.ss), group.len) != 0) {
    return sys_error("cannot bind UDP " + group.str(), errno);
  }
  int rc;
  if (group.ss.ss_family == AF_INET) {
    ip_mreqn m{};
    m.imr_multiaddr = reinterpret_cast<const sockaddr_in*>(&group.ss)->sin_addr;
    m.imr_ifindex = int(ifindex);
    rc = setsockopt(fd.get(), IPPROTO_IP, IP_ADD_MEMBERSHIP, &m, sizeof m);
  } else {
    ipv6_mreq m{};
    m.ipv6mr_multiaddr = reinterpret_cast<const sockaddr_in6*>(&group.ss)->sin6_addr;
    m.ipv6mr_interface = ifindex;
    rc = setsockopt(fd.get(), IPPROTO_IPV6, IPV6_JOIN_GROUP, &m, sizeof m);
  }
  if (rc != 0) {
    return sys_error("cannot join multicast group " + group.str() +
                         (interface.empty() ? " (no route to it? give --interface)" : " on " + interface),
                     errno);
  }
  out->reset(new UdpSocket(std::move(fd)));
  return Status::ok();
}

Status UdpSocket::set_multicast(int ttl, const std::string& interface) {
  unsigned ifindex = 0;
  SLOTSTREAM_RETURN_IF_ERROR(interface_index(interface, &ifindex));
  const int loop = 1;
  int rc = 0;
  sockaddr_storage local{};
  socklen_t len = sizeof local;
  getsockname(fd_.get(), reinterpret_cast<sockaddr*>(&local), &len);
  if (local.ss_family == AF_INET) {
    rc |= setsockopt(fd_.get(), IPPROTO_IP, IP_MULTICAST_TTL, &ttl, sizeof ttl);
    rc |= setsockopt(fd_.get(), IPPROTO_IP, IP_MULTICAST_LOOP, &loop, sizeof loop);
    if (ifindex) {
      ip_mreqn m{};
      m.imr_ifindex = int(ifindex);
      rc |= setsockopt(fd_.get(), IPPROTO_IP, IP_MULTICAST_IF, &m, sizeof m);
    }
  } else {
    rc |= setsockopt(fd_.get(), IPPROTO_IPV6, IPV6_MULTICAST_HOPS, &ttl, sizeof ttl);
    rc |= setsockopt(fd_.get(), IPPROTO_IPV6, IPV6_MULTICAST_LOOP, &loop, sizeof loop);
    if (ifindex) rc |= setsockopt(fd_.get(), IPPROTO_IPV6, IPV6_MULTICAST_IF, &ifindex, sizeof ifindex);
  }
  if (rc != 0) return sys_error("cannot set the multicast options (TTL, interface)", errno);
  return Status::ok();
}

Status UdpSocket::connect(const Address& peer) {
  if (::connect(fd_.get(), reinterpret_cast<const sockaddr*>(&peer.ss), peer.len) != 0) {
    return sys_error("connect UDP " + peer.str(), errno);
  }
  return Status::ok();
}

Address UdpSocket::local() const {
  Address a;
  a.len = sizeof a.ss;
  getsockname(fd_.get(), reinterpret_cast<sockaddr*>(&a.ss), &a.len);
  return a;
}

std::span<std::byte> UdpSocket::Batch::add(size_t bytes, const Address* to) {
  const size_t i = lens_.size();
  if (bufs_.size() <= i) bufs_.emplace_back();
  if (bufs_[i].size() < bytes) bufs_[i].resize(bytes);
  lens_.push_back(bytes);
  to_.resize(i + 1);
  has_to_.resize(i + 1);
  has_to_[i] = to != nullptr;
  if (to) to_[i] = *to;
  return {bufs_[i].data(), bytes};
}

void UdpSocket::Batch::shrink_last(size_t bytes) {
  if (!lens_.empty()) lens_.back() = bytes;
}

void UdpSocket::Batch::clear() {
  lens_.clear();
  to_.clear();
  has_to_.clear();
}

Status UdpSocket::send(Batch& b) {
  const size_t n = b.size();
  std::vector<mmsghdr> msgs(n);
  std::vector<iovec> iov(n);
  for (size_t i = 0; i < n; ++i) {
    iov[i] = {b.bufs_[i].data(), b.lens_[i]};
    msgs[i].msg_hdr.msg_iov = &iov[i];
    msgs[i].msg_hdr.msg_iovlen = 1;
    if (b.has_to_[i]) {
      msgs[i].msg_hdr.msg_name = &b.to_[i].ss;
      msgs[i].msg_hdr.msg_namelen = b.to_[i].len;
    }
  }
  size_t done = 0;
  int waits = 0;
  while (done < n) {
    int rc = ::sendmmsg(fd_.get(), msgs.data() + done, unsigned(n - done), 0);
    if (rc > 0) {
      done += size_t(rc);
      continue;
    }
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0 && (errno == EAGAIN || errno == ENOBUFS)) {
      // The socket's send buffer is full: wait for room (bounded, so a wedged kernel queue is an error).
      if (++waits > 10000) return {Code::kTimeout, "UDP send buffer stayed full for 10 s"};
      wait_fd(fd_.get(), POLLOUT, 1);
      continue;
    }
    Status st = sys_error("send UDP", errno);
    b.clear();
    return st;
  }
  b.clear();
  return Status::ok();
}

Status UdpSocket::send_one(std::span<const std::byte> d, const Address* to) {
  Batch b(1);
  auto dst = b.add(d.size(), to);
  std::memcpy(dst.data(), d.data(), d.size());
  return send(b);
}

UdpSocket::Inbox::Inbox(size_t max) : bufs_(max), lens_(max), from_(max), truncated_(max) {
  for (auto& b : bufs_) b.resize(kInboxDatagram);
}

Status UdpSocket::receive(Inbox& in) {
  const size_t n = in.bufs_.size();
  std::vector<mmsghdr> msgs(n);
  std::vector<iovec> iov(n);
  for (size_t i = 0; i < n; ++i) {
    iov[i] = {in.bufs_[i].data(), in.bufs_[i].size()};
    msgs[i].msg_hdr.msg_iov = &iov[i];
    msgs[i].msg_hdr.msg_iovlen = 1;
    msgs[i].msg_hdr.msg_name = &in.from_[i].ss;
    msgs[i].msg_hdr.msg_namelen = sizeof(sockaddr_storage);
  }
  in.count_ = 0;
  for (;;) {
    int rc = ::recvmmsg(fd_.get(), msgs.data(), unsigned(n), MSG_DONTWAIT, nullptr);
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::ok();
      return sys_error("receive UDP", errno);
    }
    for (int i = 0; i < rc; ++i) {
      in.lens_[i] = msgs[i].msg_len;
      in.from_[i].len = msgs[i].msg_hdr.msg_namelen;
      in.truncated_[i] = msgs[i].msg_hdr.msg_flags & MSG_TRUNC;
    }
    in.count_ = size_t(rc);
    return Status::ok();
  }
}

FramedStream::FramedStream(Fd fd) : fd_(std::move(fd)) {
  int fl = fcntl(fd_.get(), F_GETFL);
  fcntl(fd_.get(), F_SETFL, fl | O_NONBLOCK);
}

void FramedStream::queue(std::span<const std::byte> segment) {
  // Compact what was already written so the buffer does not grow without bound.
  if (out_pos_ > 0 && out_pos_ == out_.size()) {
    out_.clear();
    out_pos_ = 0;
  }
  const size_t n = segment.size();
  out_.push_back(std::byte(n & 0xFF));
  out_.push_back(std::byte(n >> 8));
  out_.insert(out_.end(), segment.begin(), segment.end());
}

Status FramedStream::flush(int timeout_ms) {
  int waited = 0;
  while (out_pos_ < out_.size()) {
    ssize_t n = ::send(fd_.get(), out_.data() + out_pos_, out_.size() - out_pos_, MSG_NOSIGNAL);
    if (n > 0) {
      out_pos_ += size_t(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (waited >= timeout_ms)
        return {Code::kTimeout, "TCP peer accepted no data for " + std::to_string(timeout_ms) + " ms"};
      wait_fd(fd_.get(), POLLOUT, 10);
      waited += 10;
      continue;
    }
    return {Code::kPeerGone, std::string("TCP connection lost: ") + strerror(errno)};
  }
  out_.clear();
  out_pos_ = 0;
  return Status::ok();
}

Status FramedStream::read_available() {
  if (in_pos_ > 0) {
    in_.erase(in_.begin(), in_.begin() + ptrdiff_t(in_pos_));
    in_pos_ = 0;
  }
  // At most 1 MiB per call: a sender faster than we parse would otherwise keep this loop reading (and
  // the buffer growing) without a frame ever being handled.
  for (int reads = 0; reads < 16; ++reads) {
    const size_t old = in_.size();
    in_.resize(old + 65536);
    ssize_t n = ::recv(fd_.get(), in_.data() + old, 65536, 0);
    in_.resize(old + (n > 0 ? size_t(n) : 0));
    if (n > 0) continue;
    if (n == 0) {
      eof_ = true;
      return {Code::kPeerGone, "TCP connection closed by the peer"};
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::ok();
    eof_ = true;
    return {Code::kPeerGone, std::string("TCP connection lost: ") + strerror(errno)};
  }
  return Status::ok();
}

bool FramedStream::next_frame(std::span<const std::byte>* frame) {
  if (in_.size() - in_pos_ < 2) return false;
  const size_t n = std::to_integer<size_t>(in_[in_pos_]) | std::to_integer<size_t>(in_[in_pos_ + 1]) << 8;
  if (in_.size() - in_pos_ - 2 < n) return false;
  *frame = std::span<const std::byte>(in_.data() + in_pos_ + 2, n);
  in_pos_ += 2 + n;
  return true;
}

}  // namespace slotstream::dgram
