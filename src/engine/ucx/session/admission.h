// Which connections a receiver serves: a connection counts as unauthenticated from its
// accept until its sender has proven the token (without a token: until its hello was accepted),
// and those have a budget of their own, far smaller than the authenticated connections':
//
//   - at most kMaxUnauthenticated at once; a connection beyond that evicts one of them: one that
//     has not spoken before one that has (sent any bytes: its thread marks it before it reads
//     them, and until then the receiver finds them waiting in the kernel, so a sender whose
//     thread is slow to run is never taken for a silent one), of the address that has the most
//     of them (the per-address cap: whoever floods pays first), the oldest first;
//   - at most kMaxAuthenticated authenticated connections; beyond that a sender is refused (busy).
//
// So connections that never authenticate — 2,000 half-open ones reopened as fast as they are
// closed — can no longer fill the receiver and lock out every real sender: they take turns in the
// small budget while a sender that authenticates moves on. Pure bookkeeping (no sockets, no
// clock: arrival order is the id order); the receiver (src/engine/ucx/receiver.cc) acts on its answers.
// Threading: not thread-safe; the receiver calls it under its lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>

namespace slotstream::session {

// Each authenticated connection costs a thread and a region: beyond this a sender is refused at once
// rather than growing the process without bound.
inline constexpr size_t kMaxAuthenticated = 1024;
// Handshakes in progress: a real sender leaves this budget within a round trip or two.
inline constexpr size_t kMaxUnauthenticated = 128;

class Admission {
 public:
  // Whether a connection not yet known to have spoken has bytes waiting to be read.
  using HasSpoken = std::function<bool(uint64_t id)>;

  // A connection from `source` (its numeric address) was accepted; `id`s increase with arrival.
  // Returns the id of an unauthenticated connection to close to make room for it, if any; a
  // candidate for which `has_spoken` says yes is kept as one that spoke, and another is chosen.
  std::optional<uint64_t> arrive(uint64_t id, const std::string& source, const HasSpoken& has_spoken = {});
  // The connection sent bytes (its HELLO, being read): it is kept over those that have not.
  void spoke(uint64_t id);
  // The connection authenticated: nullopt when it may go on, else why it is refused (busy).
  std::optional<std::string> authenticate(uint64_t id);
  // The connection ended (also after being evicted: then nothing happens).
  void ended(uint64_t id);

  size_t unauthenticated() const { return pending_.size(); }
  size_t authenticated() const { return authenticated_.size(); }

 private:
  struct Pending {
    std::string source;
    bool spoke = false;
  };
  // The unauthenticated connection to evict for room (see above).
  std::optional<uint64_t> victim() const;

  std::map<uint64_t, Pending> pending_;  // by id: oldest first
  std::set<uint64_t> authenticated_;
};

}  // namespace slotstream::session
