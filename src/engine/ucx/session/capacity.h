// The capacity query (`send --to A,B,C` picks the least loaded receiver): a CAPACITY_REQUEST on
// the control port instead of a HELLO, answered with CAPACITY (wire/control.h). The receiver's
// answer is host_capacity(); the asking side is query_capacity() (slotstream.h).
#pragma once

#include <cstdint>

#include "wire/control.h"

namespace slotstream::session {

// This host's capacity as a receiver serving `senders` connections with `backlog_bytes` waiting
// for workers: adds the 1-minute load average per CPU (/proc/loadavg) and the free space in
// /dev/shm (where shm regions live). Any thread.
wire::CapacityInfo host_capacity(uint32_t senders, uint64_t backlog_bytes);

}  // namespace slotstream::session
