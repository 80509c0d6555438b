// Internal helpers shared by the sender and the receiver.
#pragma once

#include <string>
#include <vector>

#include "slotstream/slotstream.h"

namespace slotstream {

// Identifies this machine (boot id + host name): equal on both ends means one host.
std::string host_id();
// What two processes of one host must share for UCX's shared memory to reach from one to the
// other: the IPC namespace (UCX's posix and sysv transports are reachable only within one, and
// sysv segments live in it) and the user (segments are created 0600/0660 and posix segments are
// opened through /proc/PID/fd, which needs the owner's user). "ipc=4026531839,uid=0".
std::string shm_domain();
// "a, b, c": items joined by `sep`, for messages a person reads.
std::string join(const std::vector<std::string>& items, const char* sep = ", ");
// What to do about a failed bind(2) of a listening address: " (another process has that port: ...)"
// for EADDRINUSE, EADDRNOTAVAIL and EACCES, "" otherwise.
std::string bind_error_hint(int err);
// "1.5 GiB", "640 KiB", "12 B": for messages a person reads.
std::string format_bytes(uint64_t bytes);

// Memory a new allocation can take now: the kernel's MemAvailable, and within a cgroup with a limit
// (v2, then v1) what the limit leaves; UINT64_MAX when neither can be read.
uint64_t available_memory();

}  // namespace slotstream
