#include "engine/ucx/session/transport_choice.h"

#include <gtest/gtest.h>

namespace slotstream::session {
namespace {

constexpr Transport kAuto = Transport::kAuto, kShm = Transport::kShm, kTcp = Transport::kTcp, kRdma = Transport::kRdma;
constexpr Transport kAll[] = {kAuto, kShm, kTcp, kRdma};

// The facts of one pair of ends: one host or two, one shm domain or two, and what each offers.
struct Pair {
  bool same_host, same_domain, sender_shm, sender_rdma, receiver_rdma;
  EndFacts sender() const {
    return {same_host ? "host-a" : "host-b", same_domain ? "ipc=1,uid=0" : "ipc=2,uid=0", sender_shm, sender_rdma};
  }
  EndFacts receiver() const { return {"host-a", "ipc=1,uid=0", true, receiver_rdma}; }
  std::string name() const {
    return std::string(same_host ? "one host" : "two hosts") + (same_domain ? ", one shm domain" : ", two domains") +
           (sender_shm ? "" : ", sender's shm failed") + (sender_rdma ? ", sender rdma" : "") +
           (receiver_rdma ? ", receiver rdma" : "");
  }
};

// Every pair of facts (32).
std::vector<Pair> every_pair() {
  std::vector<Pair> out;
  for (int bits = 0; bits < 32; ++bits) {
    out.push_back({bool(bits & 1), bool(bits & 2), bool(bits & 4), bool(bits & 8), bool(bits & 16)});
  }
  return out;
}

// auto on both ends, written out: shm needs one host, one domain and a sender that did not fail
// on it; rdma needs both devices; tcp otherwise.
Transport auto_choice(const Pair& p) {
  if (p.same_host && p.same_domain && p.sender_shm) return kShm;
  if (p.sender_rdma && p.receiver_rdma) return kRdma;
  return kTcp;
}

TEST(TransportChoice, AutoOnBothEndsPicksShmThenRdmaThenTcpForEveryPairOfFacts) {
  for (const Pair& p : every_pair()) {
    SCOPED_TRACE(p.name());
    const TransportChoice c = choose_transport(kAuto, kAuto, p.sender(), p.receiver());
    ASSERT_TRUE(c.transport.has_value()) << c.refusal;
    EXPECT_EQ(*c.transport, auto_choice(p));
    EXPECT_FALSE(c.reason.empty());
    EXPECT_TRUE(c.refusal.empty());
  }
}

// Whether an explicitly named transport can run for a pair.
bool usable(Transport t, const Pair& p) {
  if (t == kShm) return p.same_host && p.same_domain && p.sender_shm;
  if (t == kRdma) return p.sender_rdma && p.receiver_rdma;
  return true;
}

TEST(TransportChoice, EveryReceiverSettingSenderRequestAndPairOfFacts) {
  // 4 receiver settings x 4 sender requests x 32 pairs: 512 cases.
  for (Transport allowed : kAll) {
    for (Transport requested : kAll) {
      for (const Pair& p : every_pair()) {
        SCOPED_TRACE(std::string("recv --transport ") + transport_name(allowed) + ", send --transport " +
                     transport_name(requested) + ", " + p.name());
        const TransportChoice c = choose_transport(allowed, requested, p.sender(), p.receiver());
        if (allowed == kAuto && requested == kAuto) continue;  // the test above
        if (allowed != kAuto && requested != kAuto && allowed != requested) {
          EXPECT_EQ(c.transport, std::nullopt);
          EXPECT_EQ(c.refusal, std::string("this receiver only accepts transport ") + transport_name(allowed));
          continue;
        }
        const Transport named = requested != kAuto ? requested : allowed;
        if (usable(named, p)) {
          EXPECT_EQ(c.transport, named) << c.refusal;
          EXPECT_FALSE(c.reason.empty());
        } else {
          EXPECT_EQ(c.transport, std::nullopt);
          EXPECT_NE(c.refusal.find(transport_name(named)), std::string::npos) << c.refusal;
          EXPECT_NE(c.refusal.find("use tcp"), std::string::npos) << "says what to do instead: " << c.refusal;
        }
      }
    }
  }
}

TEST(TransportChoice, RefusalsAndReasonsSayWhatDiffers) {
  const EndFacts receiver{"host-a", "ipc=1,uid=0", true, false};
  // shm between two hosts: the long-standing message.
  EXPECT_EQ(choose_transport(kAuto, kShm, {"host-b", "ipc=1,uid=0", true, false}, receiver).refusal,
            "transport shm needs sender and receiver on one host; use tcp");
  // One host, but another user: shm is refused with the reason, and auto falls to tcp saying why.
  const EndFacts other_user{"host-a", "ipc=1,uid=65534", true, false};
  EXPECT_EQ(choose_transport(kAuto, kShm, other_user, receiver).refusal,
            "transport shm cannot be used: the sender runs as another user, where shared memory does not reach; "
            "use tcp");
  const TransportChoice c = choose_transport(kAuto, kAuto, other_user, receiver);
  EXPECT_EQ(c.transport, kTcp);
  EXPECT_EQ(c.reason,
            "no shm (the sender runs as another user, where shared memory does not reach), no rdma (neither end "
            "has a usable RDMA device)");
  // A sender whose shm set-up failed, both with RDMA: rdma, and why not shm.
  const TransportChoice r =
      choose_transport(kAuto, kAuto, {"host-a", "ipc=1,uid=0", false, true}, {"host-a", "ipc=1,uid=0", true, true});
  EXPECT_EQ(r.transport, kRdma);
  EXPECT_EQ(r.reason, "no shm (the sender's shm set-up failed); both ends have a usable RDMA device");
  EXPECT_EQ(choose_transport(kAuto, kRdma, {"host-b", "", true, true}, receiver).refusal,
            "transport rdma: the receiver has no usable RDMA device; use tcp");
  EXPECT_EQ(choose_transport(kRdma, kAuto, {"host-b", "", true, false}, {"host-a", "", true, true}).refusal,
            "transport rdma: the sender has no usable RDMA device; use tcp");
}

TEST(TransportChoice, SameHostMeansEqualHostIds) {
  // An auto sender whose host id differs only in case or a suffix is on another host: tcp.
  const EndFacts receiver{"host-a", "ipc=1,uid=0", true, false};
  EXPECT_EQ(choose_transport(kAuto, kAuto, {"Host-A", "ipc=1,uid=0", true, false}, receiver).transport, kTcp);
  EXPECT_EQ(choose_transport(kAuto, kAuto, {"host-a2", "ipc=1,uid=0", true, false}, receiver).transport, kTcp);
  EXPECT_EQ(choose_transport(kAuto, kAuto, {"host-a", "ipc=1,uid=0", true, false}, receiver).transport, kShm);
}

TEST(TransportChoice, ShmDomainDifferenceNamesEachField) {
  EXPECT_EQ(shm_domain_difference("ipc=1,uid=0", "ipc=1,uid=0"), "");
  EXPECT_EQ(shm_domain_difference("ipc=2,uid=0", "ipc=1,uid=0"), "in another IPC namespace");
  EXPECT_EQ(shm_domain_difference("ipc=1,uid=5", "ipc=1,uid=0"), "as another user");
  EXPECT_EQ(shm_domain_difference("ipc=2,uid=5", "ipc=1,uid=0"), "in another IPC namespace and as another user");
  // A sender that says nothing about its domain (or garbage) is not assumed to share one.
  EXPECT_EQ(shm_domain_difference("", "ipc=1,uid=0"), "in another IPC namespace and as another user");
  EXPECT_EQ(shm_domain_difference("uid=0", "ipc=1,uid=0"), "in another IPC namespace");
}

}  // namespace
}  // namespace slotstream::session
