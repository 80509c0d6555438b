// The benchmark's ceiling for any protocol on UCX: raw puts into the receiver's blocks,
// rotating over them (not one cache-hot address), with no status bytes, no flow control and
// a flush every kFlushEvery operations. Nothing is delivered; it is a reference, not a protocol
// for data (Descriptor::reference).
#pragma once

#include "engine/ucx/protocol/protocol.h"

namespace slotstream::protocol {

inline constexpr uint32_t kRawPutFlushEvery = 64;

extern const Descriptor kUcxRawPut;

}  // namespace slotstream::protocol
