// libFuzzer target: the datagram segment decoder (header checks and CRC32C) and the control messages it
// carries (src/engine/dgram/wire/wire.h, src/engine/dgram/wire/control.h) — everything a receiver does with a datagram
// from anyone before it trusts a byte of it.
//
// Properties checked on every input:
//   - decoding never reads out of bounds or crashes (AddressSanitizer, UBSan);
//   - a segment that decodes re-encodes to exactly the same bytes (no field is dropped or widened; with the
//     A flag, its headers and payload: the MAC is the key holder's to make);
//   - the same bytes with their last four replaced by the correct CRC32C reach the field checks behind
//     the CRC, with the same round-trip property.
// Build and run: bash fuzz/run.sh dgram_header (fuzz/README.md).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "engine/dgram/wire/control.h"
#include "engine/dgram/wire/crc32c.h"
#include "engine/dgram/wire/wire.h"

using namespace slotstream::dgram;

namespace {

void check(const std::span<const std::byte> datagram) {
  auto seg = decode_segment(datagram);
  if (!seg) return;
  std::vector<std::byte> again(datagram.size() + 64);
  if (seg->header.has_mac) {
    if (seg->mac.size() != kMacTagSize) __builtin_trap();
    const size_t hs = encode_header(seg->header, seg->payload.size(), again);
    std::memcpy(again.data() + hs, seg->payload.data(), seg->payload.size());
    const size_t n = hs + seg->payload.size();
    if (n != seg->signed_bytes.size() || std::memcmp(again.data(), seg->signed_bytes.data(), n) != 0) __builtin_trap();
  } else {
    const size_t n = encode_segment(seg->header, seg->payload, again);
    if (n != datagram.size() || std::memcmp(again.data(), datagram.data(), n) != 0) __builtin_trap();
  }
  if (seg->header.opcode == Opcode::kSend && seg->header.queue == kControlQueue) {
    std::span<const uint8_t> p(reinterpret_cast<const uint8_t*>(seg->payload.data()), seg->payload.size());
    // Each decoder accepts only its own type, exactly; a decoded message re-encodes to the same bytes.
    if (auto m = decode_hello(p); m && encode_control(*m) != std::vector<uint8_t>(p.begin(), p.end())) __builtin_trap();
    if (auto m = decode_accept(p); m && encode_control(*m) != std::vector<uint8_t>(p.begin(), p.end()))
      __builtin_trap();
    if (auto m = decode_fin(p); m && encode_control(*m) != std::vector<uint8_t>(p.begin(), p.end())) __builtin_trap();
    if (auto m = decode_fin_ack(p); m && encode_control(*m) != std::vector<uint8_t>(p.begin(), p.end()))
      __builtin_trap();
    if (auto m = decode_challenge(p); m && encode_control(*m) != std::vector<uint8_t>(p.begin(), p.end()))
      __builtin_trap();
    if (auto m = decode_auth(p); m && encode_control(*m) != std::vector<uint8_t>(p.begin(), p.end())) __builtin_trap();
    if (auto m = decode_announce(p); m && encode_control(*m) != std::vector<uint8_t>(p.begin(), p.end()))
      __builtin_trap();
    if (auto m = decode_terminate(p); m && encode_terminate(*m) != std::vector<uint8_t>(p.begin(), p.end()))
      __builtin_trap();
    (void)decode_refuse(p);  // a reason longer than 255 bytes is cut when encoded: decode only
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
  check(in);  // as received: a mutated segment almost always fails its CRC here
  if (size < kCrcSize) return 0;
  // Resealed with the correct CRC32C, so that the header checks behind it are explored too.
  std::vector<std::byte> sealed(in.begin(), in.end());
  const uint32_t crc = crc32c(in.first(size - kCrcSize));
  for (size_t i = 0; i < kCrcSize; ++i) sealed[size - kCrcSize + i] = std::byte(crc >> (8 * i));
  check(sealed);
  return 0;
}
