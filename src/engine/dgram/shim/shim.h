// What the shim's readiness wrappers (readiness.cc: poll, select, epoll) ask its socket layer
// (receive.cc). Internal to libslotstream_udp.so.
#pragma once

#include <dlfcn.h>

#include <climits>
#include <cstdint>

namespace slotstream::dgram::shim {

struct Readiness {
  bool udp = false;             // a UDP socket the shim handles (else: the kernel's answer stands)
  bool readable = false;        // a datagram for the application is there now
  int64_t wake_ns = INT64_MAX;  // when a reassembly timer may hand one over (partial delivery only)
};

// Whether the application can read a datagram from fd now. With `drain`, what the kernel holds ahead of
// the first deliverable datagram is taken first: segments of large datagrams are placed (a completed one
// becomes readable), datagrams the shim drops are dropped — so that neither wakes the application.
Readiness readiness(int fd, bool drain);

// No system call: whether any socket has recombination state. If none, no socket can be readable through
// the shim alone, and the wrappers need not ask each one before waiting.
bool any_held();

// The libc function this library's wrapper of `name` stands in front of.
template <class F>
F next(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
}

}  // namespace slotstream::dgram::shim
