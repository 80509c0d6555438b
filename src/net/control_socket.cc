#include "net/control_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common.h"

namespace slotstream::net {
namespace {

using Clock = std::chrono::steady_clock;

Status sys_error(const std::string& what) { return {Code::kConnectFailed, what + ": " + strerror(errno)}; }

// Options of every control connection, both ends. No delay for the small frames; and liveness:
// a peer that vanishes without closing (host down, cable cut, network namespace gone) sends
// neither FIN nor RST, so without keepalive its connection — and its sender name — would stay
// for the kernel's two hours. Probes after 5 idle seconds, every 2 s, 3 unanswered: gone after
// about 11 s (kPeerTimeout); unacknowledged data gives up after the same time.
void tune(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  int idle = 5, interval = 2, count = 3;
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
  unsigned timeout_ms = unsigned(std::chrono::duration_cast<Millis>(kPeerTimeout).count());
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &timeout_ms, sizeof timeout_ms);
}

int remaining_ms(Clock::time_point deadline) { return static_cast<int>(time_left(deadline).count()); }

std::string format_addr(const sockaddr_storage& ss) {
  char host[NI_MAXHOST] = "?", port[NI_MAXSERV] = "?";
  getnameinfo(reinterpret_cast<const sockaddr*>(&ss), sizeof ss, host, sizeof host, port, sizeof port,
              NI_NUMERICHOST | NI_NUMERICSERV);
  if (ss.ss_family == AF_INET6) return std::string("[") + host + "]:" + port;
  return std::string(host) + ":" + port;
}

}  // namespace

Status parse_host_port(const std::string& text, std::string* host, uint16_t* port) {
  std::string h, p;
  if (!text.empty() && text[0] == '[') {
    auto close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return {Code::kInvalidArgument, "expected [IPV6]:PORT, got '" + text + "'"};
    }
    h = text.substr(1, close - 1);
    p = text.substr(close + 2);
  } else {
    auto colon = text.rfind(':');
    if (colon == std::string::npos) return {Code::kInvalidArgument, "expected HOST:PORT, got '" + text + "'"};
    h = text.substr(0, colon);
    p = text.substr(colon + 1);
  }
  char* end = nullptr;
  long v = std::strtol(p.c_str(), &end, 10);
  if (h.empty() || p.empty() || *end != '\0' || v < 0 || v > 65535) {
    return {Code::kInvalidArgument, "expected HOST:PORT with a port 0-65535, got '" + text + "'"};
  }
  *host = h;
  *port = static_cast<uint16_t>(v);
  return Status::ok();
}

ControlSocket::~ControlSocket() {
  if (fd_ >= 0) ::close(fd_);
}

Status ControlSocket::connect(const std::string& host, uint16_t port, Millis timeout,
                              std::unique_ptr<ControlSocket>* out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::string port_str = std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), port_str.c_str(), &hints, &res); rc != 0) {
    return {Code::kConnectFailed, "cannot resolve '" + host + "': " + gai_strerror(rc)};
  }
  Status last{Code::kConnectFailed, "no address for '" + host + "'"};
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) {
      last = sys_error("socket");
      continue;
    }
    int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc < 0 && errno == EINPROGRESS) {
      pollfd pfd{fd, POLLOUT, 0};
      rc = ::poll(&pfd, 1, static_cast<int>(timeout.count()));
      int err = 0;
      socklen_t len = sizeof err;
      if (rc == 1) getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (rc == 0) err = ETIMEDOUT;
      rc = err == 0 && rc == 1 ? 0 : -1;
      errno = err;
    }
    if (rc == 0) {
      tune(fd);
      freeaddrinfo(res);
      out->reset(new ControlSocket(fd));
      return Status::ok();
    }
    last = {Code::kConnectFailed, "cannot connect to " + host + ":" + port_str + ": " + strerror(errno) +
                                      " (is `slotstream recv` running there?)"};
    ::close(fd);
  }
  freeaddrinfo(res);
  return last;
}

namespace {

// The MAC of one signed frame (wire/control.h): its direction, type, sequence number and body.
Mac frame_mac(const Key& key, bool from_sender, wire::MsgType type, uint64_t sequence, std::span<const uint8_t> body) {
  const uint8_t t = static_cast<uint8_t>(type);
  std::array<uint8_t, 8> seq{};
  for (int i = 0; i < 8; ++i) seq[i] = static_cast<uint8_t>(sequence >> (8 * i));
  return mac(key, from_sender ? "frame s>r" : "frame r>s", {{&t, 1}, seq, body});
}

}  // namespace

void ControlSocket::sign_frames(const Key& key, bool sender) { signing_ = Signing{key, sender}; }

Status ControlSocket::verify(wire::Frame* frame) {
  Signing& s = *signing_;
  std::vector<uint8_t>& body = frame->body;
  if (body.size() < wire::kFrameTrailer) {
    return {Code::kAuthFailed, "control frame authentication failed: an unsigned frame (type " +
                                   std::to_string(int(frame->type)) +
                                   ") on an authenticated connection, forged by something between the two ends"};
  }
  const size_t n = body.size() - wire::kFrameTrailer;
  uint64_t sequence = 0;
  for (int i = 0; i < 8; ++i) sequence |= uint64_t(body[n + i]) << (8 * i);
  const Mac expected = frame_mac(s.key, !s.sender, frame->type, sequence, {body.data(), n});
  if (!mac_equal({body.data() + n + 8, wire::kMacSize}, expected)) {
    return {Code::kAuthFailed, "control frame authentication failed: a frame (type " +
                                   std::to_string(int(frame->type)) +
                                   ") without the session's MAC, forged or altered by something between the two ends"};
  }
  if (sequence != s.received) {
    return {Code::kAuthFailed, "control frame authentication failed: a frame replayed or reordered (sequence " +
                                   std::to_string(sequence) + ", expected " + std::to_string(s.received) + ")"};
  }
  ++s.received;
  body.resize(n);
  return Status::ok();
}

Status ControlSocket::send(wire::MsgType type, std::span<const uint8_t> body) {
  std::vector<uint8_t> signed_body;
  if (signing_) {
    Signing& s = *signing_;
    const Mac m = frame_mac(s.key, s.sender, type, s.sent, body);
    signed_body.assign(body.begin(), body.end());
    for (int i = 0; i < 8; ++i) signed_body.push_back(static_cast<uint8_t>(s.sent >> (8 * i)));
    signed_body.insert(signed_body.end(), m.begin(), m.end());
    ++s.sent;
    body = signed_body;
  }
  auto frame = wire::encode_frame(type, body);
  size_t off = 0;
  auto deadline = Clock::now() + Millis(5000);
  while (off < frame.size()) {
    ssize_t n = ::send(fd_, frame.data() + off, frame.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += n;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd pfd{fd_, POLLOUT, 0};
      if (::poll(&pfd, 1, remaining_ms(deadline)) == 0) return {Code::kTimeout, "control send timed out"};
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return {Code::kPeerGone, std::string("control connection lost: ") + strerror(errno)};
  }
  stamp(&last_sent_);
  return Status::ok();
}

Status ControlSocket::read_exact(uint8_t* p, size_t n, Clock::time_point deadline) {
  size_t off = 0;
  while (off < n) {
    ssize_t r = ::recv(fd_, p + off, n - off, 0);
    if (r > 0) {
      off += r;
      continue;
    }
    if (r == 0) return {Code::kPeerGone, off == 0 ? "connection closed by peer" : "connection closed mid-message"};
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      pollfd pfd{fd_, POLLIN, 0};
      int rc = ::poll(&pfd, 1, remaining_ms(deadline));
      if (rc == 0) return {Code::kTimeout, "timed out waiting for the peer"};
      continue;
    }
    return {Code::kPeerGone, std::string("control connection lost: ") + strerror(errno)};
  }
  return Status::ok();
}

Status ControlSocket::receive(Millis timeout, wire::Frame* out) {
  auto deadline = Clock::now() + timeout;
  uint8_t len_bytes[4];
  SLOTSTREAM_RETURN_IF_ERROR(read_exact(len_bytes, 4, deadline));
  uint32_t len = len_bytes[0] | len_bytes[1] << 8 | len_bytes[2] << 16 | uint32_t(len_bytes[3]) << 24;
  if (len == 0 || len > wire::kMaxFrame) return not_a_frame(len_bytes, len);
  std::vector<uint8_t> buf(len);
  SLOTSTREAM_RETURN_IF_ERROR(read_exact(buf.data(), len, deadline));
  out->type = static_cast<wire::MsgType>(buf[0]);
  out->body.assign(buf.begin() + 1, buf.end());
  SLOTSTREAM_RETURN_IF_ERROR(signing_ ? verify(out) : Status::ok());
  stamp(&last_received_);
  return Status::ok();
}

// Text where a frame length should be is another protocol's greeting or answer ("HTTP/1.1 400",
// "SSH-2.0-"): quote its first line (what came with it, at most 60 characters), so that the error
// names the service instead of a length of 1347703880.
Status ControlSocket::not_a_frame(const uint8_t first[4], uint32_t len) {
  std::string text(reinterpret_cast<const char*>(first), 4);
  char more[60];
  const ssize_t n = ::recv(fd_, more, sizeof more, MSG_DONTWAIT);
  if (n > 0) text.append(more, size_t(n));
  text = text.substr(0, text.find_first_of("\r\n"));
  const bool printable =
      text.size() >= 4 && std::all_of(text.begin(), text.end(), [](char c) { return c >= 0x20 && c < 0x7f; });
  if (!printable) {
    return {Code::kProtocolError, "bad frame length " + std::to_string(len) + " (garbage on the control socket?)"};
  }
  foreign_text_ = text;
  return {Code::kProtocolError, "not slotstream's control protocol: the peer sent '" + text + "'"};
}

Status ControlSocket::expect(wire::MsgType type, Millis timeout, std::vector<uint8_t>* body) {
  wire::Frame f;
  SLOTSTREAM_RETURN_IF_ERROR(receive(timeout, &f));
  if (f.type == type) {
    *body = std::move(f.body);
    return Status::ok();
  }
  if (f.type == wire::MsgType::kRefuse) {
    wire::Refuse refuse;
    SLOTSTREAM_RETURN_IF_ERROR(wire::decode(f.body, &refuse));
    return {refuse.code, "refused by peer: " + refuse.message};
  }
  return {Code::kProtocolError, "unexpected control message type " + std::to_string(int(f.type))};
}

Status ControlSocket::expect(wire::MsgType type, Millis timeout, std::vector<uint8_t>* body,
                             const std::function<void()>& meanwhile) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    pollfd pfd{fd_, POLLIN, 0};
    if (::poll(&pfd, 1, 1) != 0) break;  // something to read (or an error for receive to report)
    if (Clock::now() >= deadline) return {Code::kTimeout, "timed out waiting for the peer"};
    meanwhile();
  }
  return expect(type, time_left(deadline), body);
}

Status ControlSocket::wait_readable(Millis timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    pollfd pfd{fd_, POLLIN, 0};
    const int rc = ::poll(&pfd, 1, remaining_ms(deadline));
    if (rc > 0) return Status::ok();
    if (rc < 0 && errno != EINTR) return sys_error("poll");
    if (Clock::now() >= deadline) return {Code::kTimeout, "nothing received"};
  }
}

Status ControlSocket::check_alive() {
  pollfd pfd{fd_, POLLIN, 0};
  int rc = ::poll(&pfd, 1, 0);
  if (rc == 0) return Status::ok();
  if (pfd.revents & (POLLERR | POLLHUP)) return {Code::kPeerGone, "control connection closed by peer"};
  uint8_t b;
  ssize_t n = ::recv(fd_, &b, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return {Code::kPeerGone, "control connection closed by peer"};
  if (n < 0 && errno != EAGAIN && errno != EINTR) {
    return {Code::kPeerGone, std::string("control connection lost: ") + strerror(errno)};
  }
  return n > 0 ? Status{Code::kInProgress, "frame pending"} : Status::ok();
}

void ControlSocket::drain_and_close(Millis wait) {
  if (fd_ < 0) return;
  ::shutdown(fd_, SHUT_WR);
  auto deadline = Clock::now() + wait;
  char buf[4096];
  for (size_t total = 0; total < (1u << 20) && Clock::now() < deadline;) {
    pollfd pfd{fd_, POLLIN, 0};
    if (::poll(&pfd, 1, remaining_ms(deadline)) <= 0) break;
    ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n <= 0) break;
    total += size_t(n);
  }
  ::close(fd_);
  fd_ = -1;
}

std::string ControlSocket::peer_host() const {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  char host[NI_MAXHOST] = "";
  if (getpeername(fd_, reinterpret_cast<sockaddr*>(&ss), &len) != 0 ||
      getnameinfo(reinterpret_cast<const sockaddr*>(&ss), len, host, sizeof host, nullptr, 0, NI_NUMERICHOST) != 0) {
    return "";
  }
  return host;
}

std::string ControlSocket::peer() const {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getpeername(fd_, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  return format_addr(ss);
}

Listener::~Listener() {
  if (fd_ >= 0) ::close(fd_);
}

Status Listener::open(const std::string& host, uint16_t port, std::unique_ptr<Listener>* out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  std::string port_str = std::to_string(port);
  const char* node = (host == "*" || host.empty()) ? nullptr : host.c_str();
  if (int rc = getaddrinfo(node, port_str.c_str(), &hints, &res); rc != 0) {
    return {Code::kInvalidArgument, "cannot resolve listen address '" + host + "': " + gai_strerror(rc)};
  }
  int fd = ::socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, res->ai_protocol);
  if (fd < 0) {
    freeaddrinfo(res);
    return sys_error("socket");
  }
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  // The kernel's whole accept queue (net.core.somaxconn): under a flood of connections that never
  // speak, a sender's connection waits its turn there, its HELLO already received (admission keeps
  // such a connection, engine/ucx/session/admission.h), rather than its SYN being dropped until its connect
  // times out.
  if (::bind(fd, res->ai_addr, res->ai_addrlen) != 0 || ::listen(fd, SOMAXCONN) != 0) {
    const int err = errno;
    Status st = sys_error("cannot listen on " + host + ":" + port_str);
    st = {st.code(), st.message() + bind_error_hint(err)};
    ::close(fd);
    freeaddrinfo(res);
    return st;
  }
  freeaddrinfo(res);
  out->reset(new Listener(fd, host));
  return Status::ok();
}

Status Listener::accept(Millis timeout, std::unique_ptr<ControlSocket>* out) {
  out->reset();
  pollfd pfd{fd_, POLLIN, 0};
  int rc = ::poll(&pfd, 1, static_cast<int>(timeout.count()));
  if (rc <= 0) return Status::ok();
  int fd = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd < 0) {
    if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) return Status::ok();
    return sys_error("accept");
  }
  tune(fd);
  out->reset(new ControlSocket(fd));
  return Status::ok();
}

std::string Listener::address() const {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  getsockname(fd_, reinterpret_cast<sockaddr*>(&ss), &len);
  return format_addr(ss);
}

}  // namespace slotstream::net
