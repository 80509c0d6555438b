// slotstreamsrc's zero-copy buffer: a lent message's payload as a GstMemory over its receive block. Apart from the
// element so that tests/gst/lent_memory_test.cc checks it with real views (where the memory lies, who releases).
#pragma once

#include <gst/gst.h>

#include <span>

#include "slotstream/slotstream.h"

namespace slotstream::gst {

// A buffer of one read-only GstMemory over `payload` (which lies inside view.data()), taking the view: the block
// stays held (status 2) until the last buffer sharing the memory is freed, on whichever thread frees it
// (MessageView::release may be called from any). READONLY: an element that maps it for writing gets a copy
// (gst_buffer_map), never writes into the block. An empty payload: a buffer without memory, the view released.
GstBuffer* wrap_lent(MessageView view, std::span<const std::byte> payload);

}  // namespace slotstream::gst
