#include "engine/ucx/session/handshake.h"

#include <gtest/gtest.h>

#include <numeric>

namespace slotstream::session {
namespace {

wire::Hello good_hello() {
  wire::Hello h;
  h.protocol = "status_byte";
  h.blocks = 32;
  h.block_size = 1 << 20;
  h.transport = Transport::kAuto;
  h.host_id = "host-a";
  h.shm_domain = "ipc=1,uid=0";
  h.name = "edge-a";
  h.devices = {0, 1, 2};
  return h;
}

// A receiver on host-a in shm domain "ipc=1,uid=0" that allows `allowed` and serves rdma over `rdma`.
ReceiverTerms receiver(Transport allowed = Transport::kAuto, bool has_rdma = false,
                       RdmaTransport rdma = RdmaTransport::kRc) {
  return {allowed, rdma, {"host-a", "ipc=1,uid=0", true, has_rdma}};
}

// The refusal message for `hello` (asserting it is refused with kRefused and leaves *terms alone).
std::string refused(const wire::Hello& hello, Transport allowed = Transport::kAuto) {
  HelloTerms terms;
  auto r = check_hello(hello, receiver(allowed), &terms);
  if (!r) {
    ADD_FAILURE() << "accepted";
    return "";
  }
  EXPECT_EQ(r->code, Code::kRefused);
  EXPECT_EQ(terms.protocol, nullptr);  // output set only on success
  return r->message;
}

TEST(Handshake, AcceptsAGoodHelloAndSaysWhatItAsksFor) {
  HelloTerms terms;
  wire::Hello h = good_hello();
  ASSERT_FALSE(check_hello(h, receiver(), &terms));
  ASSERT_NE(terms.protocol, nullptr);
  EXPECT_EQ(terms.protocol, protocol::find("status_byte"));
  EXPECT_EQ(terms.transport, Transport::kShm);  // auto on one host
  h.host_id = "host-b";
  ASSERT_FALSE(check_hello(h, receiver(), &terms));
  EXPECT_EQ(terms.transport, Transport::kTcp);
}

TEST(Handshake, RefusesUnknownProtocolsAndBadOptions) {
  wire::Hello h = good_hello();
  h.protocol = "carrier_pigeon";
  EXPECT_EQ(refused(h), "unknown protocol 'carrier_pigeon'");
  h = good_hello();
  h.options = "no_such_option=1";
  EXPECT_NE(refused(h), "");
  h = good_hello();
  h.options = "not an option list";
  EXPECT_NE(refused(h), "");
}

TEST(Handshake, RefusesBlockGeometryOutsideTheLimits) {
  const std::pair<uint32_t, uint32_t> bad[] = {
      {0, 1 << 20}, {kMaxBlocks + 1, 1 << 20}, {32, kMinBlockSize - 1}, {32, kMaxBlockSize + 1}};
  for (auto [blocks, size] : bad) {
    wire::Hello h = good_hello();
    h.blocks = blocks;
    h.block_size = size;
    EXPECT_EQ(refused(h), "unsupported block geometry " + std::to_string(blocks) + " x " + std::to_string(size) + " B");
  }
  // The limits themselves are fine.
  HelloTerms terms;
  for (auto [blocks, size] : {std::pair{1u, kMinBlockSize}, std::pair{kMaxBlocks, kMaxBlockSize}}) {
    wire::Hello h = good_hello();
    h.blocks = blocks;
    h.block_size = size;
    EXPECT_FALSE(check_hello(h, receiver(), &terms)) << blocks << " x " << size;
  }
}

TEST(Handshake, RefusesBadNamesAndDeviceCounts) {
  wire::Hello h = good_hello();
  h.name = "-rf";
  EXPECT_EQ(refused(h).rfind("invalid sender name: ", 0), 0u);
  h = good_hello();
  h.devices.clear();
  EXPECT_EQ(refused(h), "no devices: a sender declares 1..4096 devices");
  h.devices.resize(kMaxDevices + 1);
  std::iota(h.devices.begin(), h.devices.end(), uint16_t{0});
  EXPECT_EQ(refused(h), "more than 4096 devices (4097): a sender declares 1..4096 devices");
  h.devices = {4, 9, 4};  // one device twice would be two streams into one directory
  EXPECT_EQ(refused(h), "device 4 is listed twice");
  h.devices.resize(kMaxDevices);
  std::iota(h.devices.begin(), h.devices.end(), uint16_t{0});
  HelloTerms terms;
  EXPECT_FALSE(check_hello(h, receiver(), &terms));
}

TEST(Handshake, RefusesATransportTheReceiverDoesNotAllow) {
  wire::Hello h = good_hello();
  h.transport = Transport::kTcp;
  EXPECT_EQ(refused(h, Transport::kShm), "this receiver only accepts transport shm");
  h.transport = Transport::kShm;
  h.host_id = "host-b";
  EXPECT_EQ(refused(h), "transport shm needs sender and receiver on one host; use tcp");
}

TEST(Handshake, RdmaGoesWhereBothEndsOfferItAndTheRdmaTransportsAgree) {
  wire::Hello h = good_hello();
  h.host_id = "host-b";
  h.offers = wire::kOfferShm | wire::kOfferRdma;
  HelloTerms terms;
  ASSERT_FALSE(check_hello(h, receiver(Transport::kAuto, true), &terms));
  EXPECT_EQ(terms.transport, Transport::kRdma);
  EXPECT_EQ(terms.reason, "no shm (sender and receiver are on different hosts); both ends have a usable RDMA device");
  // A sender that insists on dc reaches a receiver serving rc: refused, saying both.
  h.rdma_transport = RdmaTransport::kDc;
  auto r = check_hello(h, receiver(Transport::kAuto, true), &terms);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->message, "this receiver serves rdma over rc, the sender asks for dc (--rdma-transport on both ends)");
  EXPECT_STREQ(refusal_labels(*r).refused, "transport");
  ASSERT_FALSE(check_hello(h, receiver(Transport::kAuto, true, RdmaTransport::kDc), &terms));
  EXPECT_EQ(terms.transport, Transport::kRdma);
  // Its rdma transport does not matter where rdma is not chosen.
  ASSERT_FALSE(check_hello(h, receiver(Transport::kAuto, false), &terms));
  EXPECT_EQ(terms.transport, Transport::kTcp);
  // The offers are what the sender's facts say.
  h.offers = 0;
  EXPECT_FALSE(sender_facts(h).shm);
  EXPECT_FALSE(sender_facts(h).rdma);
  EXPECT_EQ(sender_facts(h).shm_domain, "ipc=1,uid=0");
}

TEST(Handshake, ProofsCoverTheTokenBothNoncesAndTheWholeHello) {
  const net::Nonce nr{1, 2, 3}, ns{4, 5, 6};
  const std::vector<uint8_t> hello = {10, 20, 30, 40};
  const net::Mac mac = net::proof("secret", "sender-hello", {nr, ns, hello});
  EXPECT_TRUE(net::mac_equal(hello_proof("secret", nr, ns, hello), mac));  // what the sender sends
  EXPECT_FALSE(check_sender_proof("secret", nr, ns, hello, mac));
  std::vector<uint8_t> altered = hello;
  altered[3] ^= 1;  // e.g. a proxy added a device
  for (auto r : {check_sender_proof("secret", nr, ns, altered, mac), check_sender_proof("other", nr, ns, hello, mac),
                 check_sender_proof("secret", ns, nr, hello, mac)}) {
    ASSERT_TRUE(r);
    EXPECT_EQ(r->code, Code::kAuthFailed);
    EXPECT_EQ(r->message, "authentication failed: wrong token (or the hello was altered on the way)");
  }

  wire::Accept accept;
  accept.setup = {7, 8};
  const net::Mac a = accept_proof("secret", nr, ns, hello, accept);
  EXPECT_TRUE(net::mac_equal(a, net::proof("secret", "receiver-accept", {nr, ns, hello, wire::signed_part(accept)})));
  accept.setup = {7, 9};
  EXPECT_FALSE(net::mac_equal(a, accept_proof("secret", nr, ns, hello, accept)));

  wire::Setup setup;
  setup.setup = {9, 9};
  const net::Mac s = net::proof("secret", "sender-setup", {nr, ns, wire::signed_part(setup)});
  EXPECT_TRUE(net::mac_equal(setup_proof("secret", nr, ns, setup), s));
  setup.proof.assign(s.begin(), s.end());
  EXPECT_FALSE(check_setup_proof("secret", nr, ns, setup));
  auto bad = check_setup_proof("other", nr, ns, setup);
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->code, Code::kAuthFailed);
  setup.proof.clear();  // unsigned
  EXPECT_TRUE(check_setup_proof("secret", nr, ns, setup));
}

// Every refusal check_hello makes is counted under a reason of its own, and authentication failures
// under `authentication` plus what failed.
TEST(Handshake, RefusalsAreCountedUnderTheirReason) {
  auto label = [](wire::Hello h) {
    HelloTerms terms;
    auto r = check_hello(h, receiver(Transport::kShm), &terms);
    return r ? std::string(refusal_labels(*r).refused) : std::string("accepted");
  };
  wire::Hello h = good_hello();
  EXPECT_EQ(label(h), "accepted");
  h.protocol = "carrier_pigeon";
  EXPECT_EQ(label(h), "protocol");
  h = good_hello();
  h.options = "no_such_option=1";
  EXPECT_EQ(label(h), "options");
  h = good_hello();
  h.blocks = 0;
  EXPECT_EQ(label(h), "geometry");
  h = good_hello();
  h.name = "../etc";
  EXPECT_EQ(label(h), "name");
  h = good_hello();
  h.devices.clear();
  EXPECT_EQ(label(h), "devices");
  h = good_hello();
  h.host_id = "host-b";  // shm only, across hosts
  EXPECT_EQ(label(h), "transport");

  const auto wrong = refusal_labels(*check_sender_proof("token", {}, {}, {}, std::vector<uint8_t>(32, 0)));
  EXPECT_STREQ(wrong.refused, "authentication");
  EXPECT_STREQ(wrong.auth_failure, "wrong_token");
  EXPECT_EQ(refusal_labels({Code::kRefused, "x", "memory"}).auth_failure, nullptr);
  EXPECT_STREQ(refusal_labels({Code::kProtocolError, "garbage"}).refused, "bad_hello");
  EXPECT_STREQ(refusal_labels({Code::kTimeout, "slow"}).refused, "timeout");
  EXPECT_STREQ(refusal_labels({Code::kBusy, "no room for another authenticated connection"}).refused, "busy");
  EXPECT_STREQ(refusal_labels({Code::kAuthFailed, "x"}).auth_failure, "other");
}

TEST(Handshake, RegionIsTheBlocksAndOneStatusByteEach) {
  EXPECT_EQ(region_bytes({32, 1 << 20}), 32ull * (1 << 20) + 32);
  EXPECT_EQ(region_bytes({kMaxBlocks, kMaxBlockSize}), uint64_t(kMaxBlocks) * kMaxBlockSize + kMaxBlocks);
}

}  // namespace
}  // namespace slotstream::session
