// Which UDP sockets the preload shim wraps: SLOTSTREAM_UDP_PORTS, e.g. "5000-5999,8000". A
// datagram is wrapped (or expected wrapped) when either end's port is in the set. Unset or empty:
// every UDP port except 53, so that name lookups keep working. "all" means every port.
// Threading: immutable after parsing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace slotstream::dgram {

class PortSet {
 public:
  // The default set: everything but 53 (DNS).
  PortSet();
  // Parses a spec; false (and *error set) if it is malformed.
  static bool parse(const std::string& spec, PortSet* out, std::string* error);
  bool contains(uint16_t port) const;

 private:
  struct Range {
    uint16_t lo, hi;
  };
  std::vector<Range> ranges_;
};

}  // namespace slotstream::dgram
