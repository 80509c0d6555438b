// The option schema: every limit a front end checks, said once. The CLI's flags and its TOML config
// (`--blocks`, `block-size = "1M"`), the Python keyword arguments (`blocks=`, `block_size=`) and the
// GStreamer properties (`blocks`, `block-size`) take their ranges from here, and a value outside one
// gets the same message everywhere, after the name the front end knows the option by:
//
//   slotstream send --blocks 0    ->  --blocks: 0 is not in range 1..4096
//   slotstream.Sender(blocks=0)   ->  blocks 0 is not in range 1..4096
//   slotstreamsink blocks=0       ->  blocks: 0 is not in range 1..4096
//
// Sender::connect and Sender::validate check SenderOptions against it (check_sender_options), so a
// program that fills the options itself meets the same limits.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "slotstream/slotstream.h"
#include "slotstream/status.h"

namespace slotstream {

enum class OptionKind {
  kCount,     // a number of things
  kSize,      // bytes (the CLI takes units: 64K, 1M; messages say them in units)
  kDuration,  // time, in the spec's unit ("ms" or "s")
};

struct OptionSpec {
  // Python's keyword and the C++ field: "block_size". The CLI's flag is --block-size, the TOML key
  // block-size, the GStreamer property block-size.
  std::string_view name;
  OptionKind kind;
  double min;              // inclusive
  double max;              // inclusive
  std::string_view unit;   // "", "B", "ms" or "s"
  std::string_view where;  // which end and transport takes it: "send", "recv", "send udp", ...
  std::string_view doc;    // one line for people
  // 0 is taken besides the range and turns the option off (stall_timeout 0: wait for ever).
  bool zero_off = false;
};

// Every option with a range, in a stable order.
std::span<const OptionSpec> option_schema();
// The spec of `name` (nullptr for a name the schema does not have).
const OptionSpec* find_option(std::string_view name);

// nullopt when `value` is within the option's range (or 0 for a zero_off option); else the one message
// for it, without the option's name, which each front end puts before it: "0 is not in range 1..4096",
// "1 TiB is above the most, 64 MiB", "0.05 s is below the least, 0.1 s", "0.5 s is below the least, 2 s
// (or 0: off)".
std::optional<std::string> out_of_range(const OptionSpec& spec, double value);
// The same as a Status: kInvalidArgument "NAME: message" (for the options of a program).
Status check_option(std::string_view name, double value);

// SenderOptions' ranged fields, each against its spec: the first mistake as check_option says it
// (stall_timeout in seconds, as the schema has it).
// For the datagram transport (udp, dgram_rc) the datagram fields (segment_size, max_message, ttl)
// are checked, and block_size, which does not apply there, is not. Sender::validate says the rest
// (name, devices, protocol, what a transport cannot do).
Status check_sender_options(const SenderOptions& o);
// ReceiverOptions' ranged fields (max_held_blocks, max_memory, the datagram timeouts and max_message).
Status check_receiver_options(const ReceiverOptions& o);

// A byte count in the largest binary unit that divides it ("64 MiB", "1 GiB", "1000 B"), else with one
// decimal and the exact count ("1.5 GiB (1610612737 B)"): how every message says a size.
std::string format_size(uint64_t bytes);

}  // namespace slotstream
