// The lower layer protocols (LLP) under the datagram stack: kernel UDP sockets for UD and RD, a
// TCP stream for the RC baseline, and the fault injector placed between them and the stack.
//
// UDP: one DDP segment per datagram, sent and received in batches (sendmmsg/recvmmsg). Receive
// buffers are made large (SO_RCVBUFFORCE when permitted) because a datagram that finds the socket
// buffer full is dropped by the kernel — for UD that is loss, counted like any other.
//
// TCP (RC): iWARP frames DDP segments on a byte stream with MPA (RFC 5044). We frame them with
// MPA's 16-bit ULPDU length in front of each segment and leave out MPA's markers (the patent:
// marker placement is the overhead that datagram-iWARP avoids; a user-space receiver reading the
// stream in order does not need them to find a frame). The segment keeps its CRC32C.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "clock.h"
#include "engine/dgram/llp/injector.h"
#include "slotstream/status.h"

namespace slotstream::dgram {

struct Address {
  sockaddr_storage ss{};
  socklen_t len = 0;
  std::string str() const;  // "1.2.3.4:5" / "[::1]:5"
  uint16_t port() const;
  bool operator==(const Address& o) const;
  // Family, port and address as bytes: equal for equal addresses (a map key; what a cookie names).
  std::string identity() const;
};
// An IP multicast group: IPv4 224.0.0.0/4, IPv6 ff00::/8.
bool is_multicast(const Address& a);
// Resolves HOST:PORT parts (numeric or a name; IPv4 first) for UDP or TCP.
Status resolve(const std::string& host, uint16_t port, Address* out);

// Owns a file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept;
  ~Fd();
  int get() const { return fd_; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

class UdpSocket {
 public:
  // Binds HOST:PORT (port 0: any free one). Non-blocking, close-on-exec, buffers of `buffer_bytes`.
  static Status open(const std::string& host, uint16_t port, size_t buffer_bytes, std::unique_ptr<UdpSocket>* out);
  // A socket receiving multicast group `group` (bound to GROUP:PORT, so that it takes the group's
  // datagrams only; SO_REUSEADDR, so that receivers on one host share the port), joined on network
  // interface `interface` (a name such as eth0; empty: the one the kernel routes the group to).
  static Status open_group(const Address& group, const std::string& interface, size_t buffer_bytes,
                           std::unique_ptr<UdpSocket>* out);
  // Multicast sends from this socket: hop limit (TTL) `ttl`, out of `interface` (empty: by route),
  // looped back to receivers on this host too.
  Status set_multicast(int ttl, const std::string& interface);
  // Connects to a peer: sends go there, datagrams from anyone else are filtered by the kernel,
  // and a closed port comes back as ECONNREFUSED (kPeerGone) instead of silence.
  Status connect(const Address& peer);
  int fd() const { return fd_.get(); }
  Address local() const;

  // Datagrams to send in one sendmmsg call. Each is copied into the batch.
  class Batch {
   public:
    explicit Batch(size_t max = 64) : max_(max) {}
    // Space for one datagram of up to `bytes`, to `to` (nullptr: the connected peer).
    std::span<std::byte> add(size_t bytes, const Address* to = nullptr);
    void shrink_last(size_t bytes);  // the datagram just added is shorter
    size_t size() const { return lens_.size(); }
    bool full() const { return lens_.size() >= max_; }
    void clear();

   private:
    friend class UdpSocket;
    size_t max_;
    std::vector<std::vector<std::byte>> bufs_;
    std::vector<size_t> lens_;
    std::vector<Address> to_;
    std::vector<bool> has_to_;
  };
  // Sends the whole batch (waiting for socket space if needed) and clears it.
  Status send(Batch& batch);
  Status send_one(std::span<const std::byte> datagram, const Address* to = nullptr);

  // Up to `max` datagrams received without blocking.
  class Inbox {
   public:
    explicit Inbox(size_t max = 64);
    size_t size() const { return count_; }
    std::span<std::byte> datagram(size_t i) { return {bufs_[i].data(), lens_[i]}; }
    const Address& from(size_t i) const { return from_[i]; }
    bool truncated(size_t i) const { return truncated_[i]; }

   private:
    friend class UdpSocket;
    std::vector<std::vector<std::byte>> bufs_;
    std::vector<size_t> lens_;
    std::vector<Address> from_;
    std::vector<bool> truncated_;
    size_t count_ = 0;
  };
  // Fills the inbox (0 if nothing is waiting). An error other than "nothing waiting" is returned
  // as a Status (e.g. ECONNREFUSED after sending to a closed port: kPeerGone).
  Status receive(Inbox& inbox);

 private:
  explicit UdpSocket(Fd fd) : fd_(std::move(fd)) {}
  Fd fd_;
};

// MPA-style framing of segments on a TCP stream (see above): u16 LE length, then the segment.
class FramedStream {
 public:
  explicit FramedStream(Fd fd);
  int fd() const { return fd_.get(); }
  // Appends one framed segment to the output buffer; flush() writes it out.
  void queue(std::span<const std::byte> segment);
  // Writes queued bytes, waiting up to `timeout_ms` for socket space; kPeerGone if closed.
  Status flush(int timeout_ms = 10000);
  bool has_output() const { return out_pos_ < out_.size(); }
  size_t pending() const { return out_.size() - out_pos_; }
  // Reads what is available (up to 1 MiB) without blocking. kPeerGone at EOF/reset (after the last frame).
  Status read_available();
  // The next complete frame, if one is buffered (valid until the next read_available()).
  bool next_frame(std::span<const std::byte>* frame);
  bool eof() const { return eof_; }

 private:
  Fd fd_;
  std::vector<std::byte> out_;
  size_t out_pos_ = 0;
  std::vector<std::byte> in_;
  size_t in_pos_ = 0;
  bool eof_ = false;
};

// Applies an Injector to a stream of datagrams and passes what survives, in the (possibly changed)
// order, to emit(bytes, held): `held` is true for the datagram that was held back (so a caller can
// keep what it knows about it, such as its source address, until then).
class FaultyLink {
 public:
  explicit FaultyLink(const InjectOptions& o) : inj_(o) {}
  template <class Emit>
  void pass(std::span<const std::byte> d, Emit&& emit);
  // Releases a datagram held back for reordering.
  template <class Emit>
  void flush(Emit&& emit) {
    if (!holding_) return;
    holding_ = false;
    emit(std::span<const std::byte>(held_), true);
  }
  bool holding() const { return holding_; }
  const Injector::Stats& stats() const { return inj_.stats(); }

 private:
  Injector inj_;
  std::vector<std::byte> scratch_, held_;
  bool holding_ = false;
};

template <class Emit>
void FaultyLink::pass(std::span<const std::byte> d, Emit&& emit) {
  const Injector::Verdict v = inj_.next(d.size());
  if (v.drop) return;
  std::span<const std::byte> out = d;
  if (v.flip_bit >= 0) {
    scratch_.assign(d.begin(), d.end());
    Injector::corrupt(scratch_, v);
    out = scratch_;
  }
  if (v.reorder && !holding_) {
    held_.assign(out.begin(), out.end());
    holding_ = true;
    if (v.duplicate) emit(out, false);
    return;
  }
  emit(out, false);
  if (v.duplicate) emit(out, false);
  flush(emit);  // a held datagram goes after the one that overtook it
}

}  // namespace slotstream::dgram
