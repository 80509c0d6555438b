// Shared by the fabric's own .cc files (it includes UCX): nothing outside src/fabric uses it.
#pragma once

#include <ucp/api/ucp.h>

#include "slotstream/status.h"

namespace slotstream::fabric::internal {

// A UCX status as ours: in progress is not an error; a vanished peer is kPeerGone.
Status from_ucs(ucs_status_t st, const char* what);

}  // namespace slotstream::fabric::internal
