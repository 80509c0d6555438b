#include "engine/dgram/recv/handshake.h"

#include <algorithm>

#include "common.h"
#include "engine/hello_rules.h"
#include "slotstream/slotstream.h"

namespace slotstream::dgram {

static_assert(kMaxHelloDevices == engine::kMaxDevices, "the datagram HELLO's device limit is the engines' one");
namespace {

// Bookkeeping per message slot (a region's record or a posted receive, its assembly and ranges) and per
// device (its in-order state and report), as charged against the budget.
constexpr uint64_t kSlotOverhead = 256;
constexpr uint64_t kDeviceOverhead = 1024;
constexpr uint64_t kSessionOverhead = 64 << 10;

uint64_t mul_sat(uint64_t a, uint64_t b) {
  uint64_t r;
  return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}
uint64_t add_sat(uint64_t a, uint64_t b) { return a + b < a ? UINT64_MAX : a + b; }

std::optional<std::string> check_auth(const Hello& h, const HelloLimits& limits) {
  if (limits.token && !h.auth()) {
    return "this receiver requires authentication: give the sender the receiver's token (send --token-file)";
  }
  if (!limits.token && h.auth()) {
    return "this receiver has no token (recv --token-file), so it cannot prove itself to a sender that has one";
  }
  return std::nullopt;
}

std::optional<std::string> check_geometry(const Hello& h, const HelloLimits& limits) {
  if (auto why = engine::check_devices(h.devices)) return why;
  if (h.ring == 0 || h.ring > limits.max_ring) {
    return "ring of " + std::to_string(h.ring) + " STags per device; this receiver allows 1.." +
           std::to_string(limits.max_ring);
  }
  if (h.max_message > limits.max_message) {
    return "messages of up to " + std::to_string(h.max_message) + " B; this receiver allows " +
           std::to_string(limits.max_message) + " B (recv --max-message)";
  }
  if (h.segment_size == 0 || h.segment_size > kMaxSegmentPayload) {
    return "segment size " + std::to_string(h.segment_size) + " B; this receiver allows 1.." +
           std::to_string(kMaxSegmentPayload);
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> check_hello(const Hello& h, const HelloLimits& limits, HelloTerms* terms) {
  const Descriptor* proto = find_protocol(h.protocol);
  if (!proto) return "unknown datagram protocol '" + h.protocol.substr(0, 64) + "'";
  if (proto->over_tcp != limits.over_tcp) {
    return "protocol " + std::string(proto->name) + " runs over " + (proto->over_tcp ? "TCP" : "UDP");
  }
  if (auto why = engine::check_sender_name(h.name)) return why;
  if (auto why = check_auth(h, limits)) return why;
  if (auto why = check_geometry(h, limits)) return why;
  terms->protocol = proto;
  terms->reservation = reservation_bytes(h, *proto, limits.rd_window);
  return std::nullopt;
}

uint64_t reservation_bytes(const Hello& h, const Descriptor& p, uint32_t rd_window) {
  const uint64_t slots = mul_sat(h.devices.size(), h.ring);
  uint64_t total = mul_sat(slots, add_sat(h.max_message, kSlotOverhead));
  total = add_sat(total, mul_sat(h.devices.size(), kDeviceOverhead));
  total = add_sat(total, kSessionOverhead);
  if (p.sequenced) {
    total = add_sat(total, mul_sat(rd_window, add_sat(h.segment_size, kMaxHeaderSize + kMaxTrailerSize)));
  }
  return total;
}

std::vector<uint8_t> refuse_within(const std::string& reason, size_t room) {
  constexpr size_t kFixed = 2;  // type, str8 length
  if (room < kFixed) return {};
  std::string r = reason.substr(0, std::min<size_t>(255, room - kFixed));
  if (r.size() < reason.size() && r.size() >= 3) r.replace(r.size() - 3, 3, "...");
  return encode_control(Refuse{r});
}

std::optional<size_t> pick_eviction(std::span<const Standing> table) {
  std::optional<size_t> best;
  auto better = [&](const Standing& a, const Standing& b) {
    if (a.carried_data != b.carried_data) return !a.carried_data;
    return a.last_heard_ns < b.last_heard_ns;
  };
  for (size_t i = 0; i < table.size(); ++i) {
    if (table[i].authenticated) continue;
    if (!best || better(table[i], table[*best])) best = i;
  }
  return best;
}

}  // namespace slotstream::dgram
