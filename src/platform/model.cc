#include "platform/model.h"

#include <cstdio>

#include <nlohmann/json.hpp>

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

json amount_json(const Amount& a) {
  return {{"cpu", a.cpu}, {"bandwidth", a.bandwidth}, {"fps", a.fps}, {"memory", a.memory}};
}

Amount amount_from(const json& j) {
  return {j.value("cpu", 0.0), j.value("bandwidth", 0.0), j.value("fps", 0.0), j.value("memory", 0.0)};
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
  auto it = j.find(field);
  if (it == j.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
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
  try {
    ReceiverRecord r;
    r.name = j.at("name").get<std::string>();
    r.address = j.at("address").get<std::string>();
    r.transports = j.value("transports", std::vector<std::string>{});
    r.host_id = j.value("host_id", "");
    const json cap = j.value("capacity", json::object());
    r.capacity = {optional_number(cap, "cpu"), optional_number(cap, "bandwidth"), optional_number(cap, "fps"),
                  optional_number(cap, "memory")};
    const json free = j.value("free", json::object());
    r.free_cpu = free.value("cpu", 0.0);
    r.free_memory = free.value("memory", uint64_t(0));
    r.free_receive_memory = free.value("receive_memory", uint64_t(0));
    r.senders = j.value("senders", 0u);
    r.backlog_bytes = j.value("backlog_bytes", uint64_t(0));
    r.updated_ms = j.value("updated_ms", int64_t(0));
    *out = std::move(r);
  } catch (const json::exception& e) {
    return {Code::kProtocolError, std::string("malformed receiver record: ") + e.what()};
  }
  return Status::ok();
}

std::string encode(const Reservation& r) {
  return json{{"sender", r.sender}, {"receiver", r.receiver}, {"amount", amount_json(r.amount)}, {"devices", r.devices}}
      .dump();
}

Status decode(const std::string& text, Reservation* out) {
  json j;
  SLOTSTREAM_RETURN_IF_ERROR(parse(text, "reservation", &j));
  try {
    Reservation r;
    r.sender = j.at("sender").get<std::string>();
    r.receiver = j.at("receiver").get<std::string>();
    r.amount = amount_from(j.value("amount", json::object()));
    r.devices = j.value("devices", std::vector<uint16_t>{});
    *out = std::move(r);
  } catch (const json::exception& e) {
    return {Code::kProtocolError, std::string("malformed reservation: ") + e.what()};
  }
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
