// The option schema (include/slotstream/options.h): the limits, and the one message for a value outside
// them.
#include "slotstream/options.h"

#include <array>
#include <cmath>
#include <cstdio>

#include "engine/contract.h"
#include "engine/dgram/wire/wire.h"

namespace slotstream {

namespace {

// The datagram transport's largest segment payload: a UDP datagram less the largest header and trailer.
constexpr double kMaxSegmentSize = double(dgram::kMaxSegmentPayload);

constexpr std::array<OptionSpec, 11> kSchema = {{
    {"blocks", OptionKind::kCount, 1, kMaxBlocks, "", "send",
     "blocks the receiver gives the sender (udp: message slots per device, at most 1024)"},
    {"block_size", OptionKind::kSize, kMinBlockSize, kMaxBlockSize, "B", "send",
     "bytes per block, its 16-byte header included"},
    {"segment_size", OptionKind::kSize, 64, kMaxSegmentSize, "B", "send udp",
     "payload bytes per datagram (1408 fits a 1500-byte Ethernet MTU, 1392 with a token)"},
    {"max_message", OptionKind::kSize, 1, double(uint64_t(1) << 32), "B", "send udp, recv udp",
     "the largest message: the sender's, or the most a receiver lets a sender announce"},
    {"ttl", OptionKind::kCount, 1, 255, "", "send udp", "hop limit of the datagrams to a multicast group"},
    {"message_timeout", OptionKind::kDuration, 1, 600000, "ms", "recv udp",
     "from a message's first segment until it is given up as incomplete"},
    {"session_timeout", OptionKind::kDuration, 0.1, 86400, "s", "recv udp", "silence after which a sender is lost"},
    {"max_memory", OptionKind::kSize, 1, 1.8e19, "B", "recv", "most memory for all senders' blocks together"},
    {"max_held_blocks", OptionKind::kCount, 0, UINT32_MAX, "", "recv",
     "most blocks of one sender that zero-copy views hold at once (0: half its blocks)"},
    {"hold_block", OptionKind::kCount, 0, kMaxBlocks - 1, "", "recv",
     "a receiver block index to hold (testing; a sender has at most 4096 blocks)"},
    {"stall_timeout", OptionKind::kDuration, double(kMinStallTimeout.count()) / 1000, 86400.0 * 365, "s", "send",
     "silence of a receiver (a live one says it is alive every second) after which the sender takes it as stopped "
     "or hung (0: wait for ever)",
     /*zero_off=*/true},
}};

std::string number(double v) {
  char buf[64];
  if (v == std::floor(v) && std::fabs(v) < 1e18) {
    std::snprintf(buf, sizeof buf, "%lld", (long long)v);
  } else {
    std::snprintf(buf, sizeof buf, "%g", v);
  }
  return buf;
}

std::string with_unit(const OptionSpec& s, double v) {
  if (s.kind == OptionKind::kSize) {
    return v < 0 ? number(v) + " B" : format_size(uint64_t(v));
  }
  return s.unit.empty() ? number(v) : number(v) + " " + std::string(s.unit);
}

bool is_default(const DatagramOptions& d) {
  const DatagramOptions none;
  return d.segment_size == none.segment_size && d.max_message == none.max_message && d.ttl == none.ttl &&
         d.interface.empty() && d.faults.loss == 0 && d.faults.reorder == 0 && d.faults.duplicate == 0 &&
         d.faults.corrupt == 0;
}

}  // namespace

std::span<const OptionSpec> option_schema() { return kSchema; }

const OptionSpec* find_option(std::string_view name) {
  for (const OptionSpec& s : kSchema) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

std::optional<std::string> out_of_range(const OptionSpec& s, double value) {
  if ((value >= s.min && value <= s.max) || (s.zero_off && value == 0)) return std::nullopt;
  const std::string off = s.zero_off ? " (or 0: off)" : "";
  if (s.kind == OptionKind::kCount) {
    return number(value) + " is not in range " + number(s.min) + ".." + number(s.max) + off;
  }
  return (value > s.max ? with_unit(s, value) + " is above the most, " + with_unit(s, s.max)
                        : with_unit(s, value) + " is below the least, " + with_unit(s, s.min)) +
         off;
}

Status check_option(std::string_view name, double value) {
  const OptionSpec* s = find_option(name);
  if (!s) return {Code::kInvalidArgument, "no option '" + std::string(name) + "' in the schema"};
  if (auto why = out_of_range(*s, value)) return {Code::kInvalidArgument, std::string(name) + ": " + *why};
  return Status::ok();
}

Status check_sender_options(const SenderOptions& o) {
  SLOTSTREAM_RETURN_IF_ERROR(check_option("blocks", o.blocks));
  SLOTSTREAM_RETURN_IF_ERROR(check_option("stall_timeout", double(o.stall_timeout.count()) / 1000));
  if (engine::engine_for(o.transport, o.protocol) == engine::Kind::kUcx) {
    if (!is_default(o.datagram)) {
      return {Code::kInvalidArgument,
              "datagram options (segment_size, max_message, ttl, interface, faults) apply to transport udp only"};
    }
    return check_option("block_size", o.block_size);
  }
  if (o.block_size != kDefaultBlockSize) {
    return {Code::kInvalidArgument,
            "block_size does not apply to the datagram transport (messages are not cut into blocks: "
            "datagram.max_message is the largest one)"};
  }
  SLOTSTREAM_RETURN_IF_ERROR(check_option("segment_size", o.datagram.segment_size));
  SLOTSTREAM_RETURN_IF_ERROR(check_option("max_message", double(o.datagram.max_message)));
  if (o.datagram.ttl != 0) SLOTSTREAM_RETURN_IF_ERROR(check_option("ttl", o.datagram.ttl));
  for (auto [name, p] : {std::pair{"faults.loss", o.datagram.faults.loss},
                         {"faults.reorder", o.datagram.faults.reorder},
                         {"faults.duplicate", o.datagram.faults.duplicate},
                         {"faults.corrupt", o.datagram.faults.corrupt}}) {
    if (!(p >= 0 && p <= 1)) {
      return {Code::kInvalidArgument, std::string(name) + ": " + number(p) + " is not a fraction 0..1"};
    }
  }
  return Status::ok();
}

Status check_receiver_options(const ReceiverOptions& o) {
  SLOTSTREAM_RETURN_IF_ERROR(check_option("max_held_blocks", o.max_held_blocks));
  if (o.max_memory != 0) SLOTSTREAM_RETURN_IF_ERROR(check_option("max_memory", double(o.max_memory)));
  for (const HoldSpec& h : o.holds) SLOTSTREAM_RETURN_IF_ERROR(check_option("hold_block", h.index));
  const DatagramReceiveOptions& d = o.datagram;
  SLOTSTREAM_RETURN_IF_ERROR(check_option("message_timeout", double(d.message_timeout.count()) / 1e6));
  SLOTSTREAM_RETURN_IF_ERROR(check_option("session_timeout", double(d.session_timeout.count()) / 1e9));
  return check_option("max_message", double(d.max_message));
}

std::string format_size(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (u < 6 && bytes >= (uint64_t(1) << (10 * (u + 1))) && bytes % (uint64_t(1) << (10 * (u + 1))) == 0) ++u;
  if (u > 0 || bytes < 1024) return std::to_string(bytes >> (10 * u)) + " " + kUnits[u];
  int v = 0;  // not a whole number of any unit: one decimal, and the exact count
  while (v < 6 && bytes >= (uint64_t(1) << (10 * (v + 1)))) ++v;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f %s (%llu B)", double(bytes) / double(uint64_t(1) << (10 * v)), kUnits[v],
                (unsigned long long)bytes);
  return buf;
}

}  // namespace slotstream
