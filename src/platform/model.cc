#include "platform/model.h"

#include <cmath>
#include <cstdio>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "net/control_socket.h"
#include "slotstream/platform.h"

namespace slotstream::platform {

using nlohmann::json;

std::string receivers_prefix() { return std::string(kPrefix) + "receivers/"; }
std::string receiver_key(const std::string& receiver) { return receivers_prefix() + receiver; }
std::string reservations_prefix() { return std::string(kPrefix) + "reservations/"; }
std::string reservations_prefix(const std::string& receiver) { return reservations_prefix() + receiver + "/"; }
std::string reservation_key(const std::string& receiver, const std::string& sender) {
  return reservations_prefix(receiver) + sender;
}

Amount& Amount::operator+=(const Amount& o) {
  cpu += o.cpu;
  bandwidth += o.bandwidth;
  fps += o.fps;
  memory += o.memory;
  return *this;
}

std::string describe(const Amount& a) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "cpu %.2f, %.1f MB/s, %.0f fps, %.1f MiB", a.cpu, a.bandwidth / 1e6, a.fps,
                a.memory / 1048576.0);
  return buf;
}

namespace {

std::optional<std::string> out_of_range(const char* what, double v, double max) {
  if (std::isfinite(v) && v >= 0 && v <= max) return std::nullopt;
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s %g: must be 0..%.0f", what, v, max);
  return buf;
}

}  // namespace

std::optional<std::string> invalid_amount(const Amount& a) {
  if (auto why = out_of_range("cpu", a.cpu, kMaxCpu)) return why;
  if (auto why = out_of_range("bandwidth", a.bandwidth, kMaxBandwidth)) return why;
  if (auto why = out_of_range("fps", a.fps, kMaxFps)) return why;
  return out_of_range("memory", a.memory, kMaxMemory);
}

std::optional<std::string> invalid_record(const ReceiverRecord& r) {
  if (auto why = invalid_platform_name(r.name)) return "name '" + r.name + "': " + *why;
  std::string host;
  uint16_t port = 0;
  if (!net::parse_host_port(r.address, &host, &port).is_ok() || port == 0 || r.address.size() > 255) {
    return "address '" + r.address.substr(0, 64) + "' is not HOST:PORT";
  }
  for (unsigned char c : host) {
    if (c <= ' ' || c == 0x7f || c == '/' || c == '@') return "address '" + r.address + "' is not HOST:PORT";
  }
  if (r.transports.empty()) return "it serves no transport";
  for (const auto& t : r.transports) {
    if (t != "shm" && t != "tcp" && t != "rdma") return "unknown transport '" + t.substr(0, 16) + "'";
  }
  if (r.host_id.size() > 256) return "host id longer than 256 bytes";
  const auto& c = r.capacity;
  if (auto why = c.cpu ? out_of_range("capacity cpu", *c.cpu, kMaxCpu) : std::nullopt) return why;
  if (auto why = c.bandwidth ? out_of_range("capacity bandwidth", *c.bandwidth, kMaxBandwidth) : std::nullopt) {
    return why;
  }
  if (auto why = c.fps ? out_of_range("capacity fps", *c.fps, kMaxFps) : std::nullopt) return why;
  if (auto why = c.memory ? out_of_range("capacity memory", *c.memory, kMaxMemory) : std::nullopt) return why;
  if (auto why = out_of_range("free cpu", r.free_cpu, kMaxCpu)) return why;
  if (c.memory && double(r.free_receive_memory) > *c.memory) {
    return "more receive memory free (" + std::to_string(r.free_receive_memory) + ") than it has";
  }
  return std::nullopt;
}

namespace {

// A field that must be a finite number, or absent (0); anything else is a malformed record.
double number_field(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end()) return 0;
  if (!it->is_number() || !std::isfinite(it->get<double>())) {
    throw std::invalid_argument(std::string(field) + " is not a number");
  }
  return it->get<double>();
}

// A field that must be a non-negative integer, or absent (0).
uint64_t count_field(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end()) return 0;
  if (!it->is_number_unsigned()) throw std::invalid_argument(std::string(field) + " is not a non-negative integer");
  return it->get<uint64_t>();
}

json amount_json(const Amount& a) {
  return {{"cpu", a.cpu}, {"bandwidth", a.bandwidth}, {"fps", a.fps}, {"memory", a.memory}};
}

Amount amount_from(const json& j) {
  return {number_field(j, "cpu"), number_field(j, "bandwidth"), number_field(j, "fps"), number_field(j, "memory")};
}

json capacity_json(const Capacity& c) {
  json j = json::object();
  if (c.cpu) j["cpu"] = *c.cpu;
  if (c.bandwidth) j["bandwidth"] = *c.bandwidth;
  if (c.fps) j["fps"] = *c.fps;
  if (c.memory) j["memory"] = *c.memory;
  return j;
}

std::optional<double> optional_number(const json& j, const char* field) {
  if (!j.contains(field)) return std::nullopt;
  return number_field(j, field);
}

// An object field (absent: {}); anything else is malformed.
json object_field(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end()) return json::object();
  if (!it->is_object()) throw std::invalid_argument(std::string(field) + " is not an object");
  return *it;
}

Status parse(const std::string& text, const char* what, json* out) {
  *out = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (out->is_discarded() || !out->is_object()) return {Code::kProtocolError, std::string("malformed ") + what};
  return Status::ok();
}

}  // namespace

std::string encode(const ReceiverRecord& r) {
  json j = {{"name", r.name},
            {"address", r.address},
            {"transports", r.transports},
            {"host_id", r.host_id},
            {"capacity", capacity_json(r.capacity)},
            {"free", {{"cpu", r.free_cpu}, {"memory", r.free_memory}, {"receive_memory", r.free_receive_memory}}},
            {"senders", r.senders},
            {"backlog_bytes", r.backlog_bytes},
            {"updated_ms", r.updated_ms}};
  return j.dump();
}

Status decode(const std::string& text, ReceiverRecord* out) {
  json j;
  SLOTSTREAM_RETURN_IF_ERROR(parse(text, "receiver record", &j));
  ReceiverRecord r;
  try {
    r.name = j.at("name").get<std::string>();
    r.address = j.at("address").get<std::string>();
    r.transports = j.value("transports", std::vector<std::string>{});
    r.host_id = j.value("host_id", "");
    const json cap = object_field(j, "capacity");
    r.capacity = {optional_number(cap, "cpu"), optional_number(cap, "bandwidth"), optional_number(cap, "fps"),
                  optional_number(cap, "memory")};
    const json free = object_field(j, "free");
    r.free_cpu = number_field(free, "cpu");
    r.free_memory = count_field(free, "memory");
    r.free_receive_memory = count_field(free, "receive_memory");
    const uint64_t senders = count_field(j, "senders");
    if (senders > UINT32_MAX) throw std::invalid_argument("senders out of range");
    r.senders = uint32_t(senders);
    r.backlog_bytes = count_field(j, "backlog_bytes");
    r.updated_ms = j.value("updated_ms", int64_t(0));
  } catch (const std::exception& e) {
    return {Code::kProtocolError, std::string("malformed receiver record: ") + e.what()};
  }
  if (auto why = invalid_record(r)) return {Code::kProtocolError, "bad receiver record: " + *why};
  *out = std::move(r);
  return Status::ok();
}

std::string encode(const Reservation& r) {
  return json{{"sender", r.sender}, {"receiver", r.receiver}, {"amount", amount_json(r.amount)}, {"devices", r.devices}}
      .dump();
}

Status decode(const std::string& text, Reservation* out) {
  json j;
  SLOTSTREAM_RETURN_IF_ERROR(parse(text, "reservation", &j));
  Reservation r;
  try {
    r.sender = j.at("sender").get<std::string>();
    r.receiver = j.at("receiver").get<std::string>();
    r.amount = amount_from(object_field(j, "amount"));
    r.devices = j.value("devices", std::vector<uint16_t>{});
  } catch (const std::exception& e) {
    return {Code::kProtocolError, std::string("malformed reservation: ") + e.what()};
  }
  std::optional<std::string> why;
  if (auto bad = invalid_platform_name(r.sender)) why = "sender '" + r.sender.substr(0, 64) + "': " + *bad;
  if (auto bad = invalid_platform_name(r.receiver); bad && !why)
    why = "receiver '" + r.receiver.substr(0, 64) + "': " + *bad;
  if (!why) why = invalid_amount(r.amount);
  if (!why && r.devices.size() > kMaxReservationDevices) why = "more than 4096 devices";
  if (why) return {Code::kProtocolError, "bad reservation: " + *why};
  *out = std::move(r);
  return Status::ok();
}

std::optional<std::string> invalid_platform_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return "a name must have 1-64 characters";
  if (name[0] == '.' || name[0] == '-') return "a name must not start with '.' or '-'";
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == '-' || c == ':';
    if (!ok) return "a name may only use A-Z a-z 0-9 . _ - :";
  }
  return std::nullopt;
}

}  // namespace slotstream::platform

namespace slotstream {

Status check_platform_need(const PlatformNeed& n) {
  if (auto why = platform::invalid_amount({n.cpu, n.bandwidth, n.fps, 0})) return {Code::kInvalidArgument, *why};
  return Status::ok();
}

}  // namespace slotstream
