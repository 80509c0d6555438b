#include "engine/dgram/recv/admission.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace slotstream::dgram {
namespace {

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kAnnounceEvery = 200 * kMs;  // a multicast sender's ANNOUNCE interval (engine/dgram/wire/control.h)

TEST(ReplaceAfter, IsASecondOrTwoMessageTimeouts) {
  EXPECT_EQ(replace_after_ns(200 * kMs), 1000 * kMs);  // the default message timeout
  EXPECT_EQ(replace_after_ns(2000 * kMs), 4000 * kMs);
}

TEST(TakesName, OnlyFromASilentUdpSessionAndNeverFromProofToNone) {
  const int64_t after = 1000 * kMs;
  EXPECT_FALSE(takes_name(false, false, after - 1, false, after));    // still heard from recently
  EXPECT_TRUE(takes_name(false, false, after, false, after));         // a sender that died: restarted, it gets in
  EXPECT_FALSE(takes_name(true, false, 60'000 * kMs, false, after));  // TCP: the connection says when it ends
  // With a token: an authenticated name is not taken by a newcomer without it, however silent.
  EXPECT_FALSE(takes_name(false, true, 60'000 * kMs, false, after));
  EXPECT_TRUE(takes_name(false, true, after, true, after));
  EXPECT_TRUE(takes_name(false, false, after, true, after));
}

TEST(RefusedAnnouncers, ANameTakenIsCheckedAgainAndCountedOnce) {
  RefusedAnnouncers r;
  EXPECT_FALSE(r.holds("a", 0));  // never refused: checked
  EXPECT_TRUE(r.refuse("a", AnnounceRefusal::kNameTaken, 0));
  EXPECT_TRUE(r.holds("a", 1 * kMs));  // the same burst of ANNOUNCEs: not checked again
  EXPECT_TRUE(r.holds("a", RefusedAnnouncers::kRecheckNs - 1));
  EXPECT_FALSE(r.holds("a", RefusedAnnouncers::kRecheckNs));  // the next ANNOUNCE is checked
  EXPECT_FALSE(r.refuse("a", AnnounceRefusal::kNameTaken, RefusedAnnouncers::kRecheckNs));  // not news
  EXPECT_TRUE(r.refuse("a", AnnounceRefusal::kMemory, 2 * RefusedAnnouncers::kRecheckNs));  // another reason: news
  r.forget("a");                                                                            // admitted
  EXPECT_EQ(r.size(), 0u);
  EXPECT_FALSE(r.holds("a", 3 * RefusedAnnouncers::kRecheckNs));
  EXPECT_TRUE(r.refuse("a", AnnounceRefusal::kNameTaken, 3 * RefusedAnnouncers::kRecheckNs));  // news again
}

TEST(RefusedAnnouncers, EveryReasonThatMayPassIsRechecked) {
  for (auto why :
       {AnnounceRefusal::kNameTaken, AnnounceRefusal::kFull, AnnounceRefusal::kMemory, AnnounceRefusal::kStore}) {
    EXPECT_TRUE(RefusedAnnouncers::rechecked(why)) << refusal_label(why);
  }
  for (auto why : {AnnounceRefusal::kMalformed, AnnounceRefusal::kProtocol, AnnounceRefusal::kLimits}) {
    EXPECT_FALSE(RefusedAnnouncers::rechecked(why)) << refusal_label(why);
  }
}

// The lock-out: a sender restarted under its name, refused while the old session was fresh, was never
// checked again. Expect: it gets in at its first ANNOUNCE after the old session has been silent long enough.
TEST(RefusedAnnouncers, ARestartedSenderGetsItsNameOnceTheOldSessionIsSilent) {
  RefusedAnnouncers r;
  const int64_t after = replace_after_ns(200 * kMs);
  const int64_t old_heard = 0;  // the old sender was killed here
  int64_t admitted = -1;
  // Restarted 50 ms later: three ANNOUNCEs at once, then one every 200 ms while it sends.
  for (int64_t t = 50 * kMs, n = 0; t < 5000 * kMs && admitted < 0; t += (++n < 3 ? 0 : kAnnounceEvery)) {
    if (r.holds("new", t)) continue;
    if (takes_name(false, false, t - old_heard, false, after)) {
      r.forget("new");
      admitted = t;
    } else {
      (void)r.refuse("new", AnnounceRefusal::kNameTaken, t);
    }
  }
  ASSERT_GE(admitted, 0) << "never admitted";
  EXPECT_GE(admitted, after);
  EXPECT_LT(admitted, after + kAnnounceEvery);
  EXPECT_EQ(r.size(), 0u);
}

TEST(RefusedAnnouncers, AWrongAnnouncerIsHeldWhileItAnnouncesThenForgotten) {
  RefusedAnnouncers r;
  EXPECT_TRUE(r.refuse("rel", AnnounceRefusal::kProtocol, 0));
  r.shut_out("terminated", 0);
  int64_t t = 0;
  for (; t < 60'000 * kMs; t += kAnnounceEvery) {
    EXPECT_TRUE(r.holds("rel", t));
    EXPECT_TRUE(r.holds("terminated", t));
  }
  EXPECT_EQ(r.size(), 2u);
  // Silent for longer than kForgetNs: forgotten (checked again should it come back).
  t += RefusedAnnouncers::kForgetNs + 1;
  EXPECT_FALSE(r.holds("rel", t));
  EXPECT_FALSE(r.holds("terminated", t));
  EXPECT_EQ(r.size(), 0u);
}

TEST(RefusedAnnouncers, ExpiresSilentSendersOnly) {
  RefusedAnnouncers r;
  (void)r.refuse("quiet", AnnounceRefusal::kLimits, 0);
  (void)r.refuse("loud", AnnounceRefusal::kLimits, 0);
  for (int64_t t = kAnnounceEvery; t <= RefusedAnnouncers::kForgetNs + kAnnounceEvery; t += kAnnounceEvery) {
    EXPECT_TRUE(r.holds("loud", t));
  }
  EXPECT_EQ(r.size(), 1u);  // "quiet" went when "loud" was next heard
  EXPECT_FALSE(r.holds("quiet", RefusedAnnouncers::kForgetNs + 2 * kAnnounceEvery));
}

// A flood of refused announcers (each a new address or QP) once filled a set that was then cleared all at
// once. Expect: at most kMax remembered, the least recently heard ones forgotten first.
TEST(RefusedAnnouncers, IsBounded) {
  RefusedAnnouncers r;
  const size_t n = 5 * RefusedAnnouncers::kMax;
  (void)r.refuse("kept", AnnounceRefusal::kProtocol, 0);
  for (size_t i = 0; i < n; ++i) {
    const int64_t t = int64_t(i) * 1000;  // all within kForgetNs: only the cap forgets
    EXPECT_TRUE(r.refuse("flood" + std::to_string(i), AnnounceRefusal::kProtocol, t));
    if (i % 100 == 0) {
      EXPECT_TRUE(r.holds("kept", t));  // heard from: stays
    }
    EXPECT_LE(r.size(), RefusedAnnouncers::kMax);
  }
  EXPECT_EQ(r.size(), RefusedAnnouncers::kMax);
  const int64_t end = int64_t(n) * 1000;
  EXPECT_TRUE(r.holds("kept", end));
  EXPECT_TRUE(r.holds("flood" + std::to_string(n - 1), end));
  EXPECT_FALSE(r.holds("flood0", end));                              // pushed out
  EXPECT_TRUE(r.refuse("flood0", AnnounceRefusal::kProtocol, end));  // so news again
}

TEST(RefusalLabel, NamesEveryReason) {
  std::set<std::string> labels;
  for (size_t i = 0; i < kAnnounceRefusals; ++i) labels.insert(refusal_label(AnnounceRefusal(i)));
  EXPECT_EQ(labels.size(), kAnnounceRefusals);
  EXPECT_TRUE(labels.contains("name_taken"));
  EXPECT_FALSE(labels.contains("?"));
}

}  // namespace
}  // namespace slotstream::dgram
