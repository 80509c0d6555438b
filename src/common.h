// Internal helpers shared by the sender and the receiver.
#pragma once

#include <string>

#include "fabric/fabric.h"
#include "slotstream/slotstream.h"

namespace slotstream {

// Identifies this machine (boot id + host name): equal on both ends means shared memory works.
std::string host_id();
// A resolved transport (never kAuto) as the fabric's wire.
// "1.5 GiB", "640 KiB", "12 B": for messages a person reads.
std::string format_bytes(uint64_t bytes);

// Memory a new allocation can take now: the kernel's MemAvailable, and within a cgroup with a limit
// (v2, then v1) what the limit leaves; UINT64_MAX when neither can be read.
uint64_t available_memory();

}  // namespace slotstream
