// The datagram receiver's judgement of a HELLO before anything is allocated for it — the shape of the
// block stack's src/engine/ucx/session/handshake.h: pure decisions, unit-tested
// (tests/engine/dgram/recv/handshake_test.cc) and fuzzed (fuzz/dgram_session_fuzz.cc). The receiver
// (engine/dgram/recv/receiver.h) applies them in this order:
//
//   HELLO -> (token: CHALLENGE; AUTH -> cookie and proof, engine/dgram/wire/auth.h) -> check_hello -> name and
//   session caps -> engine::check_budget(reservation_bytes) -> the session (engine/dgram/recv/session.h) -> ACCEPT
//
// The rules that do not depend on the engine (the sender name, the device list, the memory budget)
// are engine/hello_rules.h's, shared with the block engine's check_hello.
//
// A refusal before authentication is answered with at most as many bytes as the request carried
// (refuse_within), so a forged source address gains no amplification.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/dgram/protocol/protocol.h"
#include "engine/dgram/wire/control.h"

namespace slotstream::dgram {

struct HelloLimits {
  uint64_t max_message = 64ull << 20;  // recv --max-message
  uint32_t max_ring = 256;             // STags (posted receives) per device
  uint32_t rd_window = 512;            // RD: datagrams buffered beyond a hole
  bool over_tcp = false;               // the HELLO came on a TCP connection (dgram_rc)
  bool token = false;                  // the receiver has a token (recv --token-file)
};

struct HelloTerms {
  const Descriptor* protocol = nullptr;
  uint64_t reservation = 0;  // reservation_bytes(): what the session is charged against --max-memory
};

// The reason for a REFUSE, or nullopt (and *terms set) when the hello is acceptable: a known
// protocol over the transport it came on, a valid sender name, 1..4096 devices without repeats, a
// ring of 1..max_ring, messages of at most max_message bytes in segments of 1..kMaxSegmentPayload,
// and authentication asked for exactly when the receiver has a token.
std::optional<std::string> check_hello(const Hello& h, const HelloLimits& limits, HelloTerms* terms);

// The most memory a session of this hello can come to hold: every STag (or posted receive) of every
// device with a message of the largest size in it, the bookkeeping of each, and RD's buffer beyond a
// hole. Regions are allocated only as data arrives; this is what may be promised. Saturates.
uint64_t reservation_bytes(const Hello& h, const Descriptor& p, uint32_t rd_window);

// A REFUSE payload of at most `room` bytes: the reason, cut short with "..." if it must be; empty
// when not even a REFUSE with an empty reason fits.
std::vector<uint8_t> refuse_within(const std::string& reason, size_t room);

// A session (or a TCP connection) as the admission of a new sender sees it.
struct Standing {
  bool authenticated = false;  // proved the token (never evicted)
  bool carried_data = false;   // a segment of a message was placed
  int64_t last_heard_ns = 0;
};
// Which one to end so that a new sender fits a full table: never an authenticated one; of the
// others, those that carried no data before those that did, the longest silent first. nullopt:
// none may go, and the newcomer is refused. (Without a token every session is unauthenticated, so
// a flood of hellos can push out a sender that is silent for long; with a token it cannot.)
std::optional<size_t> pick_eviction(std::span<const Standing> table);

}  // namespace slotstream::dgram
