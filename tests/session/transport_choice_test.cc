#include "session/transport_choice.h"

#include <gtest/gtest.h>

namespace slotstream::session {
namespace {

using WT = Transport;

constexpr const char* kOneHost = "transport shm needs sender and receiver on one host; use tcp";
constexpr const char* kOnlyShm = "this receiver only accepts transport shm";
constexpr const char* kOnlyTcp = "this receiver only accepts transport tcp";

struct Row {
  Transport allowed;  // recv --transport
  WT requested;       // send --transport (in the HELLO)
  bool same_host;     // equal host ids
  std::optional<Transport> expect;
  const char* refusal;  // when expect is empty
};

// Every combination: 3 receiver settings x 3 sender requests x same host or not.
const Row kRows[] = {
    {Transport::kAuto, WT::kAuto, true, Transport::kShm, nullptr},
    {Transport::kAuto, WT::kAuto, false, Transport::kTcp, nullptr},
    {Transport::kAuto, WT::kShm, true, Transport::kShm, nullptr},
    {Transport::kAuto, WT::kShm, false, std::nullopt, kOneHost},
    {Transport::kAuto, WT::kTcp, true, Transport::kTcp, nullptr},
    {Transport::kAuto, WT::kTcp, false, Transport::kTcp, nullptr},
    {Transport::kShm, WT::kAuto, true, Transport::kShm, nullptr},
    {Transport::kShm, WT::kAuto, false, std::nullopt, kOneHost},
    {Transport::kShm, WT::kShm, true, Transport::kShm, nullptr},
    {Transport::kShm, WT::kShm, false, std::nullopt, kOneHost},
    {Transport::kShm, WT::kTcp, true, std::nullopt, kOnlyShm},
    {Transport::kShm, WT::kTcp, false, std::nullopt, kOnlyShm},
    {Transport::kTcp, WT::kAuto, true, Transport::kTcp, nullptr},
    {Transport::kTcp, WT::kAuto, false, Transport::kTcp, nullptr},
    {Transport::kTcp, WT::kShm, true, std::nullopt, kOnlyTcp},
    {Transport::kTcp, WT::kShm, false, std::nullopt, kOnlyTcp},
    {Transport::kTcp, WT::kTcp, true, Transport::kTcp, nullptr},
    {Transport::kTcp, WT::kTcp, false, Transport::kTcp, nullptr},
};

TEST(TransportChoice, EveryCombinationOfReceiverSenderAndHost) {
  for (const Row& r : kRows) {
    SCOPED_TRACE(std::string("allowed ") + transport_name(r.allowed) + ", requested " +
                 std::to_string(int(r.requested)) + (r.same_host ? ", one host" : ", two hosts"));
    const TransportChoice c = choose_transport(r.allowed, r.requested, r.same_host ? "host-a" : "host-b", "host-a");
    EXPECT_EQ(c.transport, r.expect);
    EXPECT_EQ(c.refusal, r.expect ? "" : r.refusal);
  }
}

TEST(TransportChoice, SameHostMeansEqualHostIds) {
  // An auto sender whose host id differs only in case or a suffix is on another host: tcp.
  EXPECT_EQ(choose_transport(Transport::kAuto, WT::kAuto, "Host-A", "host-a").transport, Transport::kTcp);
  EXPECT_EQ(choose_transport(Transport::kAuto, WT::kAuto, "host-a2", "host-a").transport, Transport::kTcp);
  EXPECT_EQ(choose_transport(Transport::kAuto, WT::kAuto, "host-a", "host-a").transport, Transport::kShm);
}

}  // namespace
}  // namespace slotstream::session
