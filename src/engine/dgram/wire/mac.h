// The per-datagram MAC of an authenticated datagram session (engine/dgram/wire/wire.h's A flag): HMAC-SHA256
// under a 32-byte key, truncated to kMacTagSize (16) bytes, over every byte of the segment before it.
//
// Keys come from the session's handshake (engine/dgram/wire/auth.h: one per direction, fresh per session) or, for
// the preload shim, from SLOTSTREAM_UDP_KEY_FILE (one key for every datagram of every program that
// shares the file). A datagram whose tag is missing or wrong is forged, injected or damaged in a way
// its CRC did not catch: the receiving end drops and counts it. Truncation to 128 bits follows
// RFC 2104 §5 (at least half the hash, at least 80 bits).
//
// HMAC needs no nonce, so a datagram sent twice (an RD retransmission) carries the same tag, and a
// key shared by many senders (the shim) stays safe. It does not stop a replay of a whole datagram:
// inside one session the protocol layers treat one as a duplicate (RD sequence, MSN, first writer
// wins); a session's keys die with it.
//
// Threading: an object keeps an OpenSSL context, so one thread at a time per object.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string_view>

#include "engine/dgram/wire/wire.h"

struct evp_mac_ctx_st;

namespace slotstream::dgram {

using MacKey = std::array<uint8_t, 32>;

class SegmentMac {
 public:
  explicit SegmentMac(const MacKey& key);
  ~SegmentMac();
  SegmentMac(const SegmentMac&) = delete;
  SegmentMac& operator=(const SegmentMac&) = delete;

  // The tag of the concatenation of `parts`.
  void sign(std::initializer_list<std::span<const std::byte>> parts, std::span<std::byte, kMacTagSize> out);
  // The same in steps, for a gather list: start(), add() each part, finish().
  void start();
  void add(std::span<const std::byte> part);
  void finish(std::span<std::byte, kMacTagSize> out);
  // True if `tag` is the tag of `data` (constant-time comparison).
  bool verify(std::span<const std::byte> data, std::span<const std::byte> tag);
  // A decoded segment: it carries a MAC and the MAC is right.
  bool verify(const Segment& s) { return s.header.has_mac && verify(s.signed_bytes, s.mac); }

 private:
  evp_mac_ctx_st* ctx_ = nullptr;
};

// The preload shim's key: HMAC-SHA256(token, "slotstream-udp-shim-key-v1"), token being the
// contents of SLOTSTREAM_UDP_KEY_FILE (trailing whitespace removed).
MacKey shim_key(std::string_view token);

}  // namespace slotstream::dgram
