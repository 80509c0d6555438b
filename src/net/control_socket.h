// The out-of-band TCP control connection: framed messages (wire/control.h) with deadlines, and
// the liveness check that tells a sender its receiver is gone (EOF) without reading data.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "net/auth.h"
#include "slotstream/status.h"
#include "wire/control.h"

namespace slotstream::net {

using Millis = std::chrono::milliseconds;

// What is left of a timeout that ends at `deadline` (steady clock), never negative: for one deadline
// shared by several waits.
inline Millis time_left(std::chrono::steady_clock::time_point deadline) {
  return std::max(Millis(0), std::chrono::duration_cast<Millis>(deadline - std::chrono::steady_clock::now()));
}

// How long a peer that vanished without closing its control connection (host down, network cut)
// takes to be noticed: TCP keepalive and user timeout on every control socket.
inline constexpr std::chrono::seconds kPeerTimeout{11};

// Parses "HOST:PORT" (HOST may be a name, an IPv4 address or [IPv6]).
Status parse_host_port(const std::string& text, std::string* host, uint16_t* port);

class ControlSocket {
 public:
  explicit ControlSocket(int fd) : fd_(fd) {}
  ~ControlSocket();
  ControlSocket(const ControlSocket&) = delete;
  ControlSocket& operator=(const ControlSocket&) = delete;

  static Status connect(const std::string& host, uint16_t port, Millis timeout, std::unique_ptr<ControlSocket>* out);

  // From now on every frame sent carries a sequence number and a MAC under `key`, and every frame
  // received must carry the next one (wire/control.h, "Signed frames"); `sender`: which end this
  // is (each direction signs with its own label, so a frame reflected back fails). Called once,
  // after an authenticated handshake. Frames are then sent by one thread at a time, and received
  // by one thread at a time.
  void sign_frames(const Key& key, bool sender);
  bool signing() const { return signing_.has_value(); }

  Status send(wire::MsgType type, std::span<const uint8_t> body);
  // Reads one frame; kTimeout if none within `timeout`, kPeerGone on EOF, kProtocolError on a
  // bad length prefix, kAuthFailed on a signed connection's frame that fails its MAC or sequence.
  Status receive(Millis timeout, wire::Frame* out);
  // After a kProtocolError of receive(): the first line of text the peer sent where a frame was
  // expected (another service's "HTTP/1.1 400 Bad Request"), "" when it was not text.
  const std::string& foreign_text() const { return foreign_text_; }
  // Reads one frame that must be of `type` (a REFUSE is turned into its Status).
  Status expect(wire::MsgType type, Millis timeout, std::vector<uint8_t>* body);
  // expect(), calling `meanwhile` about every millisecond while no byte has come (a UCX worker
  // that must be progressed for the peer to get on: its endpoint connects to ours).
  Status expect(wire::MsgType type, Millis timeout, std::vector<uint8_t>* body, const std::function<void()>& meanwhile);
  // Waits until something can be read (bytes, or the peer's close): ok, else kTimeout.
  Status wait_readable(Millis timeout);
  // Non-blocking: kPeerGone if the peer closed (or reset) the connection, ok if still open,
  // kInProgress if a frame is waiting to be read.
  Status check_alive();
  std::string peer() const;
  // When a whole frame last came from the peer, and when one last went to it (construction until
  // the first). Any thread: a receiver sends KEEPALIVE when it has sent nothing for a while, a
  // sender calls a receiver that has said nothing for its stall timeout stopped or hung.
  std::chrono::steady_clock::time_point last_received() const { return load(last_received_); }
  std::chrono::steady_clock::time_point last_sent() const { return load(last_sent_); }
  // The peer's numeric host alone (no port, no brackets): where its other listeners are.
  std::string peer_host() const;
  // Ends our side and discards what the peer still sends for up to `wait`, so that a reply
  // (REFUSE) is not destroyed by a reset when unread garbage is pending.
  void drain_and_close(Millis wait);
  int fd() const { return fd_; }

 private:
  Status read_exact(uint8_t* p, size_t n, std::chrono::steady_clock::time_point deadline);
  Status not_a_frame(const uint8_t first[4], uint32_t len);
  // A received signed frame's body without its trailer, once its MAC and sequence are right.
  Status verify(wire::Frame* frame);
  struct Signing {
    Key key;
    bool sender;
    uint64_t sent = 0;      // sequence number of the next frame sent
    uint64_t received = 0;  // ...and of the next one expected
  };
  using Stamp = std::atomic<std::chrono::steady_clock::rep>;
  static std::chrono::steady_clock::time_point load(const Stamp& s) {
    return std::chrono::steady_clock::time_point(
        std::chrono::steady_clock::duration(s.load(std::memory_order_relaxed)));
  }
  static void stamp(Stamp* s) {
    s->store(std::chrono::steady_clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  }
  int fd_;
  std::optional<Signing> signing_;
  std::string foreign_text_;
  Stamp last_received_{std::chrono::steady_clock::now().time_since_epoch().count()};
  Stamp last_sent_{std::chrono::steady_clock::now().time_since_epoch().count()};
};

class Listener {
 public:
  ~Listener();
  static Status open(const std::string& host, uint16_t port, std::unique_ptr<Listener>* out);
  // Waits up to `timeout` for a connection; ok with *out == nullptr on timeout.
  Status accept(Millis timeout, std::unique_ptr<ControlSocket>* out);
  std::string address() const;  // "HOST:PORT" with the bound port

 private:
  explicit Listener(int fd, std::string host) : fd_(fd), host_(std::move(host)) {}
  int fd_;
  std::string host_;
};

}  // namespace slotstream::net
