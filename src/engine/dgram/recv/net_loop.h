// The datagram receiver's network loop: one UDP socket (UD and RD senders) and a TCP listener on the
// same port number (RC senders, dgram_rc), the TCP connections, receive-side fault injection
// (`recv --inject-*`), and a wake-up descriptor for the storing thread. poll_once() waits for any of
// them and hands every datagram (or TCP frame) that arrived to the Handler — the receiver, which
// decodes it and knows sessions; this unit knows only sockets.
//
// Connections are capped: at most max_connections, max_pending of them without a session (the oldest
// such is closed for a newer one), none without a session for longer than hello_timeout; at the
// descriptor limit accept() fails and the listener stays readable, so it rests for 100 ms instead of
// spinning. Every refusal is counted (ReceiverCounters) and logged within the log's limits.
// Threading: the network thread, except wake() (any thread).
#pragma once

#include <poll.h>

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/dgram/llp/injector.h"
#include "engine/dgram/llp/llp.h"
#include "engine/dgram/recv/log_limit.h"
#include "engine/dgram/recv/report.h"

namespace slotstream::dgram {

struct Peer;

// One TCP connection (dgram_rc): its stream and, once it said hello, its session.
struct Conn {
  Conn(Fd fd, Address peer, int64_t now) : stream(std::move(fd)), peer(peer), opened_ns(now) {}
  FramedStream stream;
  Address peer;
  std::shared_ptr<Peer> session;
  int64_t opened_ns;  // when it opened; once served, when its session ended
  bool closed = false;
  bool served = false;  // its session has ended: the sender is reading its FIN_ACK and will close
};

class NetLoop {
 public:
  struct Options {
    std::string host = "0.0.0.0";
    uint16_t port = 0;  // 0: a free port (the same number for UDP and TCP)
    // A multicast group as host: its datagrams are received (joined on `interface`; empty: by route),
    // and there is no TCP listener (engine/dgram/wire/control.h ANNOUNCE).
    std::string interface;
    size_t socket_buffer = 64u << 20;
    size_t max_connections = 1024;
    size_t max_pending = 64;
    int64_t hello_timeout_ns = 5'000'000'000;
    int64_t served_timeout_ns = 30'000'000'000;  // a served connection the sender never closes
    InjectOptions inject;
  };
  class Handler {
   public:
    virtual ~Handler() = default;
    // A datagram from `from` (UDP), or a frame of `conn` (TCP).
    virtual void on_datagram(std::span<const std::byte> d, const Address& from, Conn* conn) = 0;
    // A datagram too long for the receive buffer.
    virtual void on_truncated(const Address& from) = 0;
    // Whether a connection is not to be read now (RC back-pressure: TCP holds the sender back).
    virtual bool hold_back(const Conn& conn) const = 0;
  };

  static Status open(const Options& o, Handler& handler, EventLog& log, ReceiverCounters& counters,
                     std::unique_ptr<NetLoop>* out);
  ~NetLoop();
  const std::string& address() const { return address_; }
  bool multicast() const { return !listener_; }

  // Waits until something arrives, `deadline_ns` (at most 100 ms) or a wake(), and handles it.
  void poll_once(int64_t deadline_ns);
  // Closes connections past the hello deadline, and forgets closed ones without a session.
  void check_conns(int64_t now_ns);
  size_t open_connections(bool pending_only = false) const;
  // Wakes poll_once up. Any thread.
  void wake();

  void send_udp(std::span<const std::byte> d, const Address& to);
  // To a TCP connection (conn) or a UDP address; a connection that cannot take it is closed.
  void send(Conn* conn, const Address& to, std::span<const std::byte> d);
  // Fault-injection counts (recv --inject-*), if injecting.
  const Injector::Stats* injected() const;

 private:
  NetLoop(const Options& o, Handler& h, EventLog& log, ReceiverCounters& c);
  void on_udp_readable();
  void on_udp_datagram(size_t i);
  void on_accept();
  bool admit_connection(const Address& peer);
  bool evict_pending_connection();
  void on_conn_readable(Conn& c);
  int poll_timeout_ms(int64_t now, int64_t deadline) const;

  Options o_;
  Handler& handler_;
  EventLog& log_;
  ReceiverCounters& counters_;
  std::unique_ptr<UdpSocket> udp_;
  Fd listener_;
  Fd wake_;
  std::string address_;
  std::optional<FaultyLink> faults_;
  Address held_from_;  // source of the datagram the injector holds back (reorder)
  UdpSocket::Inbox inbox_{64};
  std::list<std::unique_ptr<Conn>> conns_;
  int64_t listener_rest_until_ = 0;
  std::vector<pollfd> fds_;
  std::vector<Conn*> polled_;
};

}  // namespace slotstream::dgram
