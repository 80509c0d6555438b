// What of lending asks the fabric whether memory is registered, apart: so that what links delivery
// without UCX (the fuzz targets, fuzz/CMakeLists.txt) links lending.cc without it too.
#include "engine/ucx/fabric/fabric.h"
#include "engine/ucx/stream/lending.h"

namespace slotstream {

bool MessageView::in_registered_memory() const { return lease_ && !copied_ && lease_->lending->registered(data_); }

namespace stream {

bool Lending::registered(std::span<const std::byte> bytes) const {
  return context_ && context_->registered(reinterpret_cast<uint64_t>(bytes.data()), bytes.size());
}

}  // namespace stream
}  // namespace slotstream
