#include "random.h"

#include <openssl/rand.h>

namespace slotstream {

Status random_bytes(std::span<uint8_t> out) {
  if (RAND_bytes(out.data(), static_cast<int>(out.size())) != 1) {
    return {Code::kIoError, "the system's random generator failed (RAND_bytes)"};
  }
  return Status::ok();
}

Status random_u64(uint64_t* out) {
  uint64_t value = 0;
  SLOTSTREAM_RETURN_IF_ERROR(random_bytes({reinterpret_cast<uint8_t*>(&value), sizeof value}));
  *out = value;
  return Status::ok();
}

}  // namespace slotstream
