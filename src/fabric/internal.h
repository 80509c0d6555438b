// Shared by the fabric's own .cc files (it includes UCX): nothing outside src/fabric uses it.
#pragma once

#include <ucp/api/ucp.h>

#include "slotstream/status.h"

namespace slotstream::fabric::internal {

// A UCX status as ours: in progress is not an error; a vanished peer is kPeerGone.
Status from_ucs(ucs_status_t st, const char* what);

// Counters (fabric.h) for active messages the fabric sends and handles itself (soft_rma.cc: the
// requests and replies that carry tcp puts and gets). Any thread.
void count_am_send();
void count_am_received();

}  // namespace slotstream::fabric::internal
