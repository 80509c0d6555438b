// Shared-secret authentication of a sender (optional, `--token-file`). The receiver sends a
// random nonce; the sender answers HMAC-SHA256(token, "slotstream-auth-v1" | nonce | name).
// The token never crosses the wire, and nothing about the receiver's memory is handed out
// before the answer checks.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>

#include "slotstream/status.h"
#include "wire/control.h"

namespace slotstream::net {

using Nonce = std::array<uint8_t, wire::kNonceSize>;
using Mac = std::array<uint8_t, wire::kMacSize>;

Status make_nonce(Nonce* out);
// A random 64-bit identifier (a sender's connection group).
Status make_nonce_u64(uint64_t* out);
Mac auth_mac(const std::string& token, std::span<const uint8_t> nonce, const std::string& sender_name);
// Constant-time comparison.
bool mac_equal(std::span<const uint8_t> a, std::span<const uint8_t> b);
// Reads a token file: the whole file minus trailing whitespace; empty files are an error.
Status read_token_file(const std::string& path, std::string* token);

}  // namespace slotstream::net
