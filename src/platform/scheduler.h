// The scheduling decision, pure (paper §3.1: "the platform then responds with a resource scheduling
// result based on the resource status of each edge server and the requested amount of
// resources"): given every registered receiver, what is reserved on each, and what a sender asks
// for, which receiver gets it and why — or why none can, with the shortfall.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "platform/model.h"

namespace slotstream::platform {

// A receiver as the scheduler sees it: its record and the reservations under its name (the
// requester's own, when it moves, left out by the caller).
struct ReceiverView {
  ReceiverRecord record;
  Amount reserved;
  uint32_t reservations = 0;
};

struct Decision {
  bool ok = false;
  std::string receiver;  // ok: the chosen one
  std::string why;       // ok: the reason, for people; else the refusal with every shortfall
};

// Receivers with room are those where, in every limited dimension, reserved + need <= capacity,
// and whose free receive memory right now holds `need.memory` (senders that are not the
// platform's hold memory too). Of those, the one whose most used dimension would be least used
// afterwards; ties: more free CPU now, then fewer senders, then the name. `exclude`: receivers
// the requester just lost (their keys live on until their lease expires). `transport`: "" any,
// else one the receiver must serve.
Decision choose(const std::vector<ReceiverView>& receivers, const Amount& need, const std::set<std::string>& exclude,
                const std::string& transport = "");

// What `need` lacks on `view` (empty: it fits), e.g. "cpu 0.50 short, 12.0 MiB of receive memory
// short".
std::string shortfall(const ReceiverView& view, const Amount& need);

// The views from what a range of the platform's prefix returned: records and reservations
// matched by receiver name; `leave_out`'s own reservations are not counted (it is moving), nor
// those of receivers no longer registered.
std::vector<ReceiverView> build_views(const std::vector<ReceiverRecord>& records,
                                      const std::vector<Reservation>& reservations, const std::string& leave_out);

}  // namespace slotstream::platform
