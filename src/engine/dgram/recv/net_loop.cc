#include "engine/dgram/recv/net_loop.h"

#include <netinet/tcp.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "clock.h"

namespace slotstream::dgram {
namespace {

constexpr int64_t kMs = 1'000'000;
// UDP batches handled before the receiver looks at its timers again.
constexpr int kBatchesPerTurn = 16;
// After accept() fails (the descriptor limit), the listener is not polled for this long: it stays
// readable, and polling it again at once spun the network thread at 98 % of a core.
constexpr int64_t kListenerRest = 100 * kMs;
// A reply that cannot be written at once waits at most this long (the network thread is shared).
constexpr int kReplyFlushMs = 100;
// poll() never sleeps longer than this: the receiver's own checks run at least this often.
constexpr int kMaxPollMs = 100;

// One port number for both: UDP first (port 0 picks it), then TCP on the same number; if TCP finds it
// taken, another free UDP port.
Status bind_both(const NetLoop::Options& o, std::unique_ptr<UdpSocket>* udp_out, Fd* listener, std::string* address) {
  Address group;
  SLOTSTREAM_RETURN_IF_ERROR(resolve(o.host, o.port, &group));
  if (is_multicast(group)) {
    // A group's receivers share its port number, and its senders are UD only: no TCP listener.
    if (o.port == 0) {
      return {Code::kInvalidArgument, "a multicast group needs the port its sender sends to (--listen GROUP:PORT)"};
    }
    SLOTSTREAM_RETURN_IF_ERROR(UdpSocket::open_group(group, o.interface, o.socket_buffer, udp_out));
    *address = group.str();
    return Status::ok();
  }
  if (!o.interface.empty()) {
    return {Code::kInvalidArgument,
            "--interface chooses where a multicast group is joined; " + o.host + " is no multicast group"};
  }
  Status last;
  for (int attempt = 0; attempt < 20; ++attempt) {
    std::unique_ptr<UdpSocket> udp;
    SLOTSTREAM_RETURN_IF_ERROR(UdpSocket::open(o.host, o.port, o.socket_buffer, &udp));
    Address a = udp->local();
    Fd l(::socket(a.ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    int one = 1;
    setsockopt(l.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(l.get(), reinterpret_cast<const sockaddr*>(&a.ss), a.len) == 0 && ::listen(l.get(), 64) == 0) {
      *udp_out = std::move(udp);
      *listener = std::move(l);
      *address = a.str();
      return Status::ok();
    }
    last = {Code::kIoError, "cannot listen on TCP " + a.str() + ": " + strerror(errno)};
    if (o.port != 0) return last;
  }
  return last;
}

}  // namespace

NetLoop::NetLoop(const Options& o, Handler& h, EventLog& log, ReceiverCounters& c)
    : o_(o),
      handler_(h),
      log_(log),
      counters_(c) {}

NetLoop::~NetLoop() = default;

Status NetLoop::open(const Options& o, Handler& handler, EventLog& log, ReceiverCounters& counters,
                     std::unique_ptr<NetLoop>* out) {
  std::unique_ptr<NetLoop> n(new NetLoop(o, handler, log, counters));
  SLOTSTREAM_RETURN_IF_ERROR(bind_both(o, &n->udp_, &n->listener_, &n->address_));
  n->wake_ = Fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (o.inject.any()) n->faults_.emplace(o.inject);
  *out = std::move(n);
  return Status::ok();
}

void NetLoop::wake() {
  uint64_t one = 1;
  if (::write(wake_.get(), &one, sizeof one) < 0) { /* the loop polls every 100 ms anyway */
  }
}

// ------------------------------------------------------------------ sending

void NetLoop::send_udp(std::span<const std::byte> d, const Address& to) {
  // A reply that cannot be sent is like a lost datagram: the sender repeats its request.
  (void)udp_->send_one(d, &to);
}

void NetLoop::send(Conn* conn, const Address& to, std::span<const std::byte> d) {
  if (!conn) return send_udp(d, to);
  conn->stream.queue(d);
  if (!conn->stream.flush(kReplyFlushMs).is_ok()) conn->closed = true;
}

const Injector::Stats* NetLoop::injected() const { return faults_ ? &faults_->stats() : nullptr; }

// ------------------------------------------------------------------ UDP

void NetLoop::on_udp_readable() {
  for (int turn = 0; turn < kBatchesPerTurn; ++turn) {
    Status st = udp_->receive(inbox_);
    if (!st.is_ok() || inbox_.size() == 0) return;  // (ICMP errors from old peers are not ours to act on)
    for (size_t i = 0; i < inbox_.size(); ++i) on_udp_datagram(i);
  }
}

void NetLoop::on_udp_datagram(size_t i) {
  const Address& from = inbox_.from(i);
  if (inbox_.truncated(i)) return handler_.on_truncated(from);
  if (!faults_) return handler_.on_datagram(inbox_.datagram(i), from, nullptr);
  const bool was_holding = faults_->holding();
  const Address before = held_from_;
  faults_->pass(inbox_.datagram(i), [&](std::span<const std::byte> d, bool held) {
    handler_.on_datagram(d, held ? before : from, nullptr);
  });
  if (!was_holding && faults_->holding()) held_from_ = from;
}

// ------------------------------------------------------------------ TCP

// A connection without a session closed to make room — one whose session has ended, else the oldest
// that has not said hello; false if there is none.
bool NetLoop::evict_pending_connection() {
  Conn* oldest = nullptr;
  for (auto& c : conns_) {
    if (c->closed || c->session) continue;
    if (c->served) {
      c->closed = true;
      return true;
    }
    if (!oldest || c->opened_ns < oldest->opened_ns) oldest = c.get();
  }
  if (!oldest) return false;
  oldest->closed = true;
  ++counters_.connections_evicted;
  log_("connection", "closed a connection from " + oldest->peer.str() + " that had not said hello, for a newer one");
  return true;
}

size_t NetLoop::open_connections(bool pending_only) const {
  size_t n = 0;
  for (const auto& c : conns_) n += !c->closed && (!pending_only || (!c->session && !c->served));
  return n;
}

// Room for one more connection (made by closing one without a session, if need be).
bool NetLoop::admit_connection(const Address& peer) {
  const bool full = open_connections(false) >= o_.max_connections || open_connections(true) >= o_.max_pending;
  if (!full || evict_pending_connection()) return true;
  ++counters_.connections_refused;
  log_("connection", "refused a TCP connection from " + peer.str() + ": " + std::to_string(o_.max_connections) +
                         " connections are open");
  return false;
}

void NetLoop::on_accept() {
  for (;;) {
    Address peer;
    peer.len = sizeof peer.ss;
    int fd = ::accept4(listener_.get(), reinterpret_cast<sockaddr*>(&peer.ss), &peer.len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
      ++counters_.accept_errors;
      log_("accept", std::string("cannot accept a TCP connection (") + strerror(errno) + "); pausing 100 ms");
      if (!evict_pending_connection()) listener_rest_until_ = now_ns() + kListenerRest;
      return;
    }
    if (!admit_connection(peer)) {
      ::close(fd);
      continue;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    conns_.push_back(std::make_unique<Conn>(Fd(fd), peer, now_ns()));
  }
}

void NetLoop::on_conn_readable(Conn& c) {
  Status st = c.stream.read_available();
  std::span<const std::byte> f;
  while (!c.closed && c.stream.next_frame(&f)) handler_.on_datagram(f, c.peer, &c);
  if (!st.is_ok()) c.closed = true;
}

void NetLoop::check_conns(int64_t now) {
  for (auto it = conns_.begin(); it != conns_.end();) {
    Conn& c = **it;
    if (!c.closed && c.served && now - c.opened_ns > o_.served_timeout_ns) c.closed = true;  // never closed
    if (!c.closed && !c.session && !c.served && now - c.opened_ns > o_.hello_timeout_ns) {
      c.closed = true;
      ++counters_.connections_timed_out;
      log_("connection", "closed a connection from " + c.peer.str() + ": no session within " +
                             std::to_string(o_.hello_timeout_ns / 1'000'000'000) + " s");
    }
    if (c.closed && !c.session) {
      it = conns_.erase(it);
    } else {
      ++it;
    }
  }
}

// ------------------------------------------------------------------ the loop

int NetLoop::poll_timeout_ms(int64_t now, int64_t deadline) const {
  int timeout = kMaxPollMs;
  if (deadline != INT64_MAX) timeout = int(std::clamp<int64_t>((deadline - now) / kMs + 1, 0, kMaxPollMs));
  if (listener_rest_until_ > now) timeout = std::min<int>(timeout, int((listener_rest_until_ - now) / kMs + 1));
  if (faults_ && faults_->holding()) timeout = std::min(timeout, 5);
  return timeout;
}

void NetLoop::poll_once(int64_t deadline) {
  const int64_t now = now_ns();
  fds_.clear();
  polled_.clear();
  fds_.push_back({wake_.get(), POLLIN, 0});
  fds_.push_back({udp_->fd(), POLLIN, 0});
  // At the descriptor limit the listener stays readable: rest it instead of spinning on it.
  fds_.push_back({listener_.get(), short(listener_rest_until_ > now ? 0 : POLLIN), 0});
  for (auto& c : conns_) {
    if (c->closed) continue;
    fds_.push_back({c->stream.fd(), short(handler_.hold_back(*c) ? 0 : POLLIN), 0});
    polled_.push_back(c.get());
  }
  const int n = ::poll(fds_.data(), fds_.size(), poll_timeout_ms(now, deadline));
  if (n > 0) {
    if (fds_[0].revents) {
      uint64_t v;
      if (::read(wake_.get(), &v, sizeof v) < 0) { /* spurious */
      }
    }
    if (fds_[1].revents) on_udp_readable();
    if (fds_[2].revents) on_accept();
    for (size_t i = 0; i < polled_.size(); ++i) {
      if (fds_[3 + i].revents) on_conn_readable(*polled_[i]);
    }
  }
  if (faults_ && faults_->holding() && n == 0) {
    // A datagram held back for reordering goes out when nothing overtakes it for a while.
    faults_->flush([&](std::span<const std::byte> d, bool) { handler_.on_datagram(d, held_from_, nullptr); });
  }
}

}  // namespace slotstream::dgram
