#include "engine/dgram/shim/gso.h"

namespace slotstream::dgram {

namespace {

// The batch being filled.
struct Open {
  GsoBatch batch;
  size_t bytes = 0, pieces = 0, first_size = 0, last_size = 0;

  // Whether a segment of `size` bytes and `iov` pieces may join: all so far of the first one's size (only the
  // last of a GSO message may be shorter), it no larger, the limits kept.
  bool takes(size_t size, size_t iov, const GsoLimits& limits) const {
    return batch.count > 0 && batch.count < limits.max_segments && last_size == first_size && size <= first_size &&
           first_size <= limits.max_gso_size && bytes + size <= limits.max_bytes && pieces + iov <= limits.max_iov;
  }
  void add(size_t size, size_t iov) {
    if (batch.count == 0) first_size = size;
    ++batch.count;
    bytes += size;
    pieces += iov;
    last_size = size;
  }
};

}  // namespace

std::vector<GsoBatch> plan_gso_batches(std::span<const size_t> sizes, std::span<const size_t> iovs,
                                       const GsoLimits& limits) {
  std::vector<GsoBatch> out;
  Open open;
  auto close = [&] {
    if (open.batch.count == 0) return;
    open.batch.gso_size = open.batch.count > 1 ? uint16_t(open.first_size) : 0;
    out.push_back(open.batch);
  };
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (!open.takes(sizes[i], iovs[i], limits)) {
      close();
      open = Open{};
      open.batch.first = i;
    }
    open.add(sizes[i], iovs[i]);
  }
  close();
  return out;
}

}  // namespace slotstream::dgram
