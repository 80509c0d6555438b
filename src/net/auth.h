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

Status make_nonce(Nonce* out);
// A random 64-bit identifier (a sender's connection group).
Status make_nonce_u64(uint64_t* out);
Mac proof(const std::string& token, std::string_view label, std::initializer_list<std::span<const uint8_t>> parts);
// Constant-time comparison.
bool mac_equal(std::span<const uint8_t> a, std::span<const uint8_t> b);
// Reads a token file: the whole file minus trailing whitespace; empty files are an error.
Status read_token_file(const std::string& path, std::string* token);

}  // namespace slotstream::net
