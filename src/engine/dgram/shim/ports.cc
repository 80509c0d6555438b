#include "engine/dgram/shim/ports.h"

#include <cstdlib>

namespace slotstream::dgram {

bool PortSet::parse(const std::string& spec, PortSet* out, std::string* error) {
  PortSet p;
  p.all_but_dns_ = false;
  if (spec.empty()) {
    *out = PortSet();
    return true;
  }
  if (spec == "all") {
    p.ranges_.push_back({0, 65535});
    *out = p;
    return true;
  }
  auto number = [](const std::string& t, uint16_t* v) {
    if (t.empty() || t.size() > 5) return false;
    for (char c : t) {
      if (c < '0' || c > '9') return false;
    }
    const unsigned long n = std::strtoul(t.c_str(), nullptr, 10);
    if (n == 0 || n > 65535) return false;
    *v = uint16_t(n);
    return true;
  };
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t comma = spec.find(',', pos);
    if (comma == std::string::npos) comma = spec.size();
    const std::string item = spec.substr(pos, comma - pos);
    const size_t dash = item.find('-');
    Range r{};
    bool ok = dash == std::string::npos ? number(item, &r.lo) && (r.hi = r.lo, true)
                                        : number(item.substr(0, dash), &r.lo) && number(item.substr(dash + 1), &r.hi);
    if (!ok || r.lo > r.hi) {
      *error = "SLOTSTREAM_UDP_PORTS: '" + item + "' is not a port (1-65535) or a range LO-HI";
      return false;
    }
    p.ranges_.push_back(r);
    pos = comma + 1;
  }
  *out = p;
  return true;
}

bool PortSet::listed(uint16_t port) const {
  for (const Range& r : ranges_) {
    if (port >= r.lo && port <= r.hi) return true;
  }
  return false;
}

bool PortSet::applies(uint16_t local, uint16_t remote) const {
  if (all_but_dns_) return local != 53 && remote != 53;
  return listed(local) || listed(remote);
}

}  // namespace slotstream::dgram
