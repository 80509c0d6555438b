// Which UDP datagrams the preload shim wraps: SLOTSTREAM_UDP_PORTS, e.g. "5000-5999,8000": a
// datagram is wrapped (or expected wrapped) when either end's port is in the list. Unset or
// empty: every datagram except those to or from port 53, so that name lookups keep working.
// "all": every datagram. Threading: immutable after parsing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace slotstream::dgram {

class PortSet {
 public:
  // The default: everything but port 53 (DNS).
  PortSet() = default;
  // Parses a spec; false (and *error set) if it is malformed.
  static bool parse(const std::string& spec, PortSet* out, std::string* error);
  // Whether a datagram between these ports is wrapped (0: not known, e.g. not bound yet).
  bool applies(uint16_t local, uint16_t remote) const;

 private:
  struct Range {
    uint16_t lo, hi;
  };
  bool listed(uint16_t port) const;
  bool all_but_dns_ = true;  // the default
  std::vector<Range> ranges_;
};

}  // namespace slotstream::dgram
