// Authentication of the datagram transport: `recv|send --transport udp --token-file F` (and
// `send --transport tcp --protocol dgram_rc`), the same shared-secret mutual proof as the block
// handshake (net/auth.h), shaped for datagrams:
//
//   sender   -> HELLO (flag kHelloAuth, sender nonce Ns; padded, engine/dgram/wire/control.h)
//   receiver -> CHALLENGE Nr = cookie(receiver secret, sender address, QP, Ns, time / 10 s)
//               — the receiver keeps nothing: a forged HELLO costs it one HMAC and a reply
//               smaller than the HELLO
//   sender   -> AUTH (Nr, the HELLO as sent, hello_proof = HMAC(token, Nr, Ns, HELLO))
//   receiver -> checks that Nr is a cookie it made for this address and QP in the last 10-20 s, the
//               proof, and only then the hello's terms; then allocates the session and answers
//               ACCEPT carrying accept_proof = HMAC(token, Nr, Ns, HELLO, ACCEPT)
//   sender   -> checks the proof (a receiver without the token cannot make one)
//
// Both nonces are fresh per session, so the session keys derived from them (session_keys, one per
// direction) are too, and every datagram after ACCEPT carries a MAC under its direction's key
// (engine/dgram/wire/mac.h). A proxy can neither change the hello (its proof covers every byte), nor start a
// session from another address (the cookie names the address), nor send datagrams a session accepts.
//
// The preload shim has no handshake (unmodified programs): every program that reads the same
// SLOTSTREAM_UDP_KEY_FILE signs and checks with shim_key(token) (engine/dgram/wire/mac.h).
//
// Pure functions (HMAC-SHA256 through net::proof): any thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "engine/dgram/wire/control.h"
#include "engine/dgram/wire/mac.h"

namespace slotstream::dgram {

using Proof = std::array<uint8_t, kDgramProofSize>;

// How long a CHALLENGE stays good: a cookie of this interval or the one before is accepted.
inline constexpr int64_t kCookieIntervalNs = 10'000'000'000;

// The receiver's nonce for a HELLO: an HMAC under the receiver's own random secret over who asked
// (`peer`: the sender's address bytes, its QP), its nonce and the interval number now_ns / 10 s.
DgramNonce cookie(const MacKey& secret, std::span<const uint8_t> peer, uint32_t qp, const DgramNonce& sender_nonce,
                  int64_t now_ns, int interval_back = 0);
// True if `nr` is cookie(secret, peer, qp, ns) of this interval or the previous one. Constant time.
bool cookie_valid(const MacKey& secret, std::span<const uint8_t> peer, uint32_t qp, const DgramNonce& sender_nonce,
                  const DgramNonce& nr, int64_t now_ns);

// AUTH's proof: the sender has the token, over both nonces and every byte of the HELLO it sent.
Proof hello_proof(const std::string& token, const DgramNonce& nr, const DgramNonce& ns,
                  std::span<const uint8_t> hello_bytes);
// ACCEPT's proof, computed over the ACCEPT with an empty proof field: the receiver has it too.
Proof accept_proof(const std::string& token, const DgramNonce& nr, const DgramNonce& ns,
                   std::span<const uint8_t> hello_bytes, const Accept& accept);
bool proof_equal(std::span<const uint8_t> a, std::span<const uint8_t> b);

// The per-direction MAC keys of one session.
struct SessionKeys {
  MacKey to_receiver{};
  MacKey to_sender{};
};
SessionKeys session_keys(const std::string& token, const DgramNonce& nr, const DgramNonce& ns);

}  // namespace slotstream::dgram
