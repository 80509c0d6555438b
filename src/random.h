// Random numbers from the system's cryptographic generator (OpenSSL's RAND_bytes): authentication
// nonces (net/auth.h), and identifiers a peer must not guess or meet twice — a sender's connection
// group, the session id a protocol's notifications carry (engine/ucx/protocol/). Any thread.
#pragma once

#include <cstdint>
#include <span>

#include "slotstream/status.h"

namespace slotstream {

// Fills `out`; kIoError when the generator fails (it has no entropy).
Status random_bytes(std::span<uint8_t> out);
// A random 64-bit identifier.
Status random_u64(uint64_t* out);

}  // namespace slotstream
