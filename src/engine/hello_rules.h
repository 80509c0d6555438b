// The rules of a sender's HELLO that do not depend on the engine. Both engines' judgement of a
// hello applies them — the block engine's check_hello (engine/ucx/session/handshake.h) and the datagram
// engine's (engine/dgram/recv/handshake.h), each around its own framing and its own terms (block geometry and
// transport; ring, segments and message size) — so that one mistake gets one message, whichever
// engine judges it. Pure functions; any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace slotstream::engine {

// The most devices one sender declares (all its lanes together), on either engine.
inline constexpr size_t kMaxDevices = 4096;

// The device list of a hello: 1..kMaxDevices devices, none listed twice (a device twice would be two
// streams into one directory). nullopt when acceptable, else why not.
std::optional<std::string> check_devices(std::span<const uint16_t> devices);

// The sender's name (its directory on the receiver): invalid_sender_name's rules, said as
// "invalid sender name: WHY".
std::optional<std::string> check_sender_name(std::string_view name);

// Whether `want` more bytes fit the receiver's memory budget (recv --max-memory) with `in_use`
// promised already: nullopt if they do, else the message. Saturating: no overflow.
std::optional<std::string> check_budget(uint64_t want, uint64_t in_use, uint64_t budget);

}  // namespace slotstream::engine
