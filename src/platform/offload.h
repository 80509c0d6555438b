// The overload trigger (paper §3.1: "when the data processing requirements of an edge server
// exceed its processing capacity, the server sends a resource scheduling request"): when to move
// one device's processing to a scheduled receiver, and when to take one back. Pure, so that it is
// tested on its own; the edge server (EdgeServer, src/platform/edge.cc) feeds it a load and carries out the moves.
//
// Hysteresis: offload above `above`, take back below `below` (< above), nothing in between, and
// at most one move per `settle` — the load needs time to show what the last move did. One device
// per move: the highest-numbered local one goes, the last one offloaded comes back first.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>

#include "slotstream/platform.h"
#include "slotstream/status.h"

namespace slotstream::platform {

// The policy and its moves are public (slotstream/platform.h: check_offload_policy, decide_offload).
using OffloadPolicy = slotstream::OffloadPolicy;
using Move = slotstream::OffloadMove;

// kInvalidArgument unless below < above and settle >= 0.
Status check(const OffloadPolicy& p);

// `since_last_move`: time since the last move (or attempt); nullopt before the first.
Move decide(const OffloadPolicy& p, double load, size_t local_devices, size_t offloaded_devices,
            std::optional<std::chrono::steady_clock::duration> since_last_move);

}  // namespace slotstream::platform
