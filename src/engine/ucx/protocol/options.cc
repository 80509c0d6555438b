#include "engine/ucx/protocol/options.h"

#include <algorithm>

#include "slotstream/slotstream.h"

namespace slotstream::protocol {
namespace {

Status bad(std::string_view what) { return {Code::kInvalidArgument, "protocol options: " + std::string(what)}; }

bool valid_key(std::string_view k) {
  return !k.empty() && std::all_of(k.begin(), k.end(),
                                   [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'; });
}

}  // namespace

Status Options::parse(std::string_view text, Options* out) {
  Options o;
  while (!text.empty()) {
    const size_t comma = text.find(',');
    std::string_view item = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) return bad("'" + std::string(item) + "' is not key=value");
    std::string key(item.substr(0, eq));
    std::string value(item.substr(eq + 1));
    if (!valid_key(key)) return bad("'" + key + "' is not a key (lower-case letters, digits, '_')");
    if (value.empty() || value.find_first_of(":=") != std::string::npos) {
      return bad("'" + std::string(item) + "' has no usable value");
    }
    if (!o.values_.emplace(key, value).second) return bad("'" + key + "' given twice");
    if (comma != std::string_view::npos && text.empty()) return bad("trailing ','");
  }
  *out = std::move(o);
  return Status::ok();
}

Status Options::parse_spec(std::string_view spec, std::string* name, Options* out) {
  const size_t colon = spec.find(':');
  *name = std::string(spec.substr(0, colon));
  if (colon == std::string_view::npos) {
    *out = Options();
    return Status::ok();
  }
  if (colon + 1 == spec.size()) return bad("nothing after '" + *name + ":'");
  return parse(spec.substr(colon + 1), out);
}

std::string Options::text() const {
  std::string s;
  for (const auto& [k, v] : values_) {
    if (!s.empty()) s += ',';
    s += k + "=" + v;
  }
  return s;
}

Status Options::size(std::string_view key, uint64_t fallback, uint64_t* out) const {
  auto it = values_.find(std::string(key));
  if (it == values_.end()) {
    *out = fallback;
    return Status::ok();
  }
  auto v = parse_size(it->second);
  if (!v) return bad(std::string(key) + "=" + it->second + " is not a size (e.g. 65536, 64K, 2M)");
  *out = *v;
  return Status::ok();
}

Status Options::number(std::string_view key, uint64_t fallback, uint64_t* out) const {
  auto it = values_.find(std::string(key));
  if (it == values_.end()) {
    *out = fallback;
    return Status::ok();
  }
  const std::string& t = it->second;
  if (t.size() > 19 || !std::all_of(t.begin(), t.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return bad(std::string(key) + "=" + t + " is not a whole number");
  }
  *out = std::stoull(t);
  return Status::ok();
}

Status Options::flag(std::string_view key, bool fallback, bool* out) const {
  auto it = values_.find(std::string(key));
  if (it == values_.end()) {
    *out = fallback;
    return Status::ok();
  }
  const std::string& t = it->second;
  if (t == "1" || t == "true" || t == "on" || t == "yes") {
    *out = true;
  } else if (t == "0" || t == "false" || t == "off" || t == "no") {
    *out = false;
  } else {
    return bad(std::string(key) + "=" + t + " is not on/off");
  }
  return Status::ok();
}

Status Options::choice(std::string_view key, std::initializer_list<std::string_view> allowed, std::string_view fallback,
                       std::string* out) const {
  auto it = values_.find(std::string(key));
  if (it == values_.end()) {
    *out = std::string(fallback);
    return Status::ok();
  }
  if (std::find(allowed.begin(), allowed.end(), it->second) != allowed.end()) {
    *out = it->second;
    return Status::ok();
  }
  std::string list;
  for (auto a : allowed) list += (list.empty() ? "" : "|") + std::string(a);
  return bad(std::string(key) + "=" + it->second + " is not one of " + list);
}

Status Options::check_known(std::string_view protocol, std::initializer_list<std::string_view> known) const {
  for (const auto& [k, v] : values_) {
    if (std::find(known.begin(), known.end(), k) != known.end()) continue;
    std::string list;
    for (auto n : known) list += (list.empty() ? "" : ", ") + std::string(n);
    return bad(std::string(protocol) + " has no option '" + k + "'" +
               (known.size() ? " (it takes: " + list + ")" : " (it takes none)"));
  }
  return Status::ok();
}

}  // namespace slotstream::protocol
