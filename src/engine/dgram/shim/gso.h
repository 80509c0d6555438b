// How the preload shim hands a large datagram's segments to the kernel with UDP generic segmentation offload
// (UDP_SEGMENT, Linux >= 4.18): consecutive segments of one size laid back to back in one message whose
// UDP_SEGMENT control message names that size, so that the kernel cuts the buffer at exactly the segments'
// boundaries — every datagram on the wire is still one self-contained DDP segment with its own header and CRC
// (the wire format does not change, and a receiver sees the same datagrams as without GSO), for one trip through
// UDP and IP per batch instead of one per segment. Pure (no system call), unit-tested; send.cc sends.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace slotstream::dgram {

// What one GSO message may carry.
struct GsoLimits {
  size_t max_segments = 64;     // the kernel's UDP_MAX_SEGMENTS (64 since 4.18; raised later, never lowered)
  size_t max_bytes = 65507;     // one UDP datagram's payload: 65,507 over IPv4, 65,527 over IPv6
  size_t max_iov = 1024;        // UIO_MAXIOV: the pieces of one message's scatter list
  size_t max_gso_size = 65535;  // UDP_SEGMENT takes a 16-bit size
};

// A run of segments [first, first + count) sent as one message; gso_size is 0 for a single segment (sent as it
// is, with no UDP_SEGMENT), else the size of every segment in it but the last, which may be shorter.
struct GsoBatch {
  size_t first = 0;
  size_t count = 0;
  uint16_t gso_size = 0;
};

// Cuts segments of `sizes` bytes (each with `iovs[i]` scatter pieces) into batches, in order, greedily: a segment
// joins the open batch if the batch's segments so far are all of its first one's size, it is no larger than that,
// and the limits hold; else it opens the next batch. So equal segments with a shorter last one (what
// for_each_segment cuts) are one batch per limit's worth, and whatever breaks the pattern (a duplicated short
// last segment, an injected drop) only starts a new batch. limits.max_segments = 1: every segment alone (no GSO).
std::vector<GsoBatch> plan_gso_batches(std::span<const size_t> sizes, std::span<const size_t> iovs,
                                       const GsoLimits& limits);

}  // namespace slotstream::dgram
