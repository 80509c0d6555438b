// A worker's address over the connection manager (src/engine/ucx/fabric/cm.h): what travels in ACCEPT and
// SETUP as the place a peer connects to — tcp's listener ports, and rdma's with the word a peer
// reads to prove the NIC reaches it. Pinned here byte for byte; anything else is not an address.
#include "engine/ucx/fabric/cm.h"

#include <gtest/gtest.h>

namespace slotstream::fabric {
namespace {

TEST(CmAddress, TcpsIsItsListenersPorts) {
  const std::vector<uint8_t> bytes = encode_cm_address(CmPorts{0x1234, 0xabcd});
  EXPECT_EQ(bytes, (std::vector<uint8_t>{'S', 'L', 'C', 'M', 0x34, 0x12, 0xcd, 0xab}));
  const auto back = decode_cm_address(bytes);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->ports.v4, 0x1234);
  EXPECT_EQ(back->ports.v6, 0xabcd);
  EXPECT_EQ(back->probe_address, 0u);
  EXPECT_TRUE(back->probe_rkey.empty());
}

TEST(CmAddress, RdmasCarriesTheProbeWordAndItsKey) {
  CmAddress a{{7100, 0}, 0x00007f0011223344, {9, 8, 7}};
  const std::vector<uint8_t> bytes = encode_cm_address(a);
  EXPECT_EQ(bytes, (std::vector<uint8_t>{'S',  'L',  'C',  'M',  0xbc, 0x1b, 0, 0,  // ports
                                         0x44, 0x33, 0x22, 0x11, 0x00, 0x7f, 0, 0,  // probe address
                                         3,    0,    9,    8,    7}));              // key
  const auto back = decode_cm_address(bytes);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->ports.v4, 7100);
  EXPECT_EQ(back->probe_address, a.probe_address);
  EXPECT_EQ(back->probe_rkey, a.probe_rkey);
}

TEST(CmAddress, AnythingElseIsNotAListenersAddress) {
  CmAddress a{{1, 2}, 3, {4, 5}};
  std::vector<uint8_t> bytes = encode_cm_address(a);
  for (size_t n = 0; n < bytes.size(); ++n) {
    if (n == 8) continue;  // the ports alone: tcp's form
    EXPECT_FALSE(decode_cm_address(std::span(bytes).first(n))) << n << " bytes";
  }
  bytes.push_back(0);  // longer than its key says
  EXPECT_FALSE(decode_cm_address(bytes));
  std::vector<uint8_t> ucx_worker_address(40, 0x11);  // what UCX's ucp_worker_get_address gives
  EXPECT_FALSE(decode_cm_address(ucx_worker_address));
  std::vector<uint8_t> no_key = encode_cm_address(CmPorts{1, 2});
  no_key.insert(no_key.end(), {3, 0, 0, 0, 0, 0, 0, 0, 0, 0});  // a probe without a key
  EXPECT_FALSE(decode_cm_address(no_key));
}

}  // namespace
}  // namespace slotstream::fabric
