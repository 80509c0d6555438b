// What the tests of gst/ share: an outlet whose payloads are plain vectors, and the messages of a stream.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "frame.h"
#include "shared_receiver.h"
#include "shared_sender.h"

namespace slotstream::gst::testing {

class VectorPayload : public Payload {
 public:
  explicit VectorPayload(uint64_t n) : bytes_(n) {}
  std::span<std::byte> bytes() override { return bytes_; }
  const std::vector<std::byte>& data() const { return bytes_; }

 private:
  std::vector<std::byte> bytes_;
};

inline std::shared_ptr<Outlet> make_outlet(const std::string& sender, uint16_t device, size_t capacity = 4,
                                           ZeroCopy zero_copy = ZeroCopy::kAuto) {
  return std::make_shared<Outlet>(
      sender, device, capacity, [](uint64_t n) { return std::make_unique<VectorPayload>(n); }, zero_copy);
}

// A payload of `n` bytes that differs per (device, index).
inline std::vector<std::byte> pattern(uint16_t device, int index, size_t n) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::byte((i * 13 + device * 7 + index) & 0xff);
  return v;
}

// One buffer message: header (pts = index) + payload.
inline std::vector<std::byte> buffer_message(uint16_t device, int index, size_t n) {
  std::vector<std::byte> m(kBufferHeaderSize);
  BufferHeader h;
  h.payload_length = n;
  h.pts = uint64_t(index);
  encode_buffer_header(h, std::span<std::byte, kBufferHeaderSize>(m.data(), kBufferHeaderSize));
  std::vector<std::byte> p = pattern(device, index, n);
  m.insert(m.end(), p.begin(), p.end());
  return m;
}

inline ConnectionSpec spec_for(const ReceiverHub& hub, const std::string& name, uint32_t block_size = 4096,
                               uint32_t blocks = 8) {
  ConnectionSpec s;
  EXPECT_TRUE(parse_address(hub.address(), &s.host, &s.port).is_ok());
  s.name = name;
  s.transport = Transport::kShm;
  s.block_size = block_size;
  s.blocks = blocks;
  return s;
}

// A sender of `devices` to the hub's receiver (status_byte unless `protocol` says).
inline std::unique_ptr<Sender> connect(const ReceiverHub& hub, const std::string& name, std::vector<uint16_t> devices,
                                       uint32_t block_size = 4096, uint32_t blocks = 8,
                                       Transport transport = Transport::kShm,
                                       const std::string& protocol = kDefaultProtocol) {
  ConnectionSpec s = spec_for(hub, name, block_size, blocks);
  SenderOptions o;
  o.host = s.host;
  o.port = s.port;
  o.name = name;
  o.protocol = protocol;
  o.transport = transport;
  o.block_size = block_size;
  o.blocks = blocks;
  o.devices = std::move(devices);
  std::unique_ptr<Sender> tx;
  Status st = Sender::connect(o, &tx);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return tx;
}

inline constexpr std::chrono::milliseconds kNoLimit{0};

}  // namespace slotstream::gst::testing
