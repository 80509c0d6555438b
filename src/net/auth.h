// Shared-secret mutual authentication (optional, `--token-file` on both ends; wire/control.h).
//
//   sender   -> HELLO (with a sender nonce Ns)
//   receiver -> CHALLENGE Nr
//   sender   -> AUTH   = proof(token, "sender-hello",   Nr, Ns, HELLO)
//   receiver -> ACCEPT carrying proof(token, "receiver-accept", Nr, Ns, HELLO, ACCEPT)
//   sender   -> SETUP  carrying proof(token, "sender-setup",    Nr, Ns, SETUP)
//
// proof = HMAC-SHA256(token, "slotstream-auth-v2" | label | each part as u32 length + bytes).
// Each side proves it knows the token over fresh nonces of both, and each MAC covers every
// byte its message and the HELLO carry, so a proxy can neither replay nor alter them (e.g. add
// a device). The token never crosses the wire; nothing is allocated for a sender before its
// AUTH checks; a sender with a token refuses a receiver that does not prove it has it too.
//
// After the handshake both ends hold a session key, proof(token, "session-key", Nr, Ns): fresh
// for every connection, never sent. Every control frame from SETUP's answer on (READY, PAUSE,
// FIN, FIN_ACK, REFUSE) carries a sequence number and a MAC under it (net/control_socket.h,
// wire/control.h "Signed frames"), so a frame a proxy forges, alters, replays or reflects back
// ends the session.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>

#include "slotstream/status.h"
#include "wire/control.h"

namespace slotstream::net {

using Nonce = std::array<uint8_t, wire::kNonceSize>;
using Mac = std::array<uint8_t, wire::kMacSize>;
using Key = std::array<uint8_t, wire::kMacSize>;

// A fresh nonce (random.h; random identifiers that are no nonces: random_u64 there).
Status make_nonce(Nonce* out);
// HMAC-SHA256 under `key` of "slotstream-auth-v2" | u8 label length | label | each part as u32
// length + bytes (length-prefixed: moving bytes from one part to the next changes the MAC).
Mac mac(std::span<const uint8_t> key, std::string_view label, std::initializer_list<std::span<const uint8_t>> parts);
// mac() keyed with the shared token.
Mac proof(const std::string& token, std::string_view label, std::initializer_list<std::span<const uint8_t>> parts);
// The key of one authenticated connection, derived by both ends from the token and both nonces.
Key session_key(const std::string& token, const Nonce& receiver_nonce, const Nonce& sender_nonce);
// Constant-time comparison.
bool mac_equal(std::span<const uint8_t> a, std::span<const uint8_t> b);
// Reads a token file: the whole file minus trailing whitespace; empty files are an error.
Status read_token_file(const std::string& path, std::string* token);

}  // namespace slotstream::net
