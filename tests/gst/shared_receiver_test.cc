// The shared receiver over real UCX (shm, and tcp where zero-copy is checked) in one process: routing,
// reassembly, back-pressure, stream ends, and zero-copy (buffers lent in place, the copy fallback and its reason).
#include "shared_receiver.h"

#include <gtest/gtest.h>

#include <thread>

#include "gst_test_support.h"

namespace slotstream::gst {
namespace {

using namespace testing;

struct Hub {
  std::shared_ptr<ReceiverHub> hub;
  std::vector<std::shared_ptr<Outlet>> outlets;
  std::shared_ptr<Outlet> add(const std::string& sender, uint16_t device, size_t capacity = 4,
                              ZeroCopy zero_copy = ZeroCopy::kAuto) {
    auto o = make_outlet(sender, device, capacity, zero_copy);
    std::shared_ptr<ReceiverHub> h;
    Status st = ReceiverHub::attach("127.0.0.1:0", "", o, &h);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    if (!hub) hub = h;
    EXPECT_EQ(hub, h) << "srcs of one listen text share one receiver";
    outlets.push_back(o);
    return o;
  }
  ~Hub() {
    for (auto& o : outlets) hub->detach(o);
  }
};

// The next delivery; notes (how the stream is received) are skipped unless asked for.
Delivery pop(Outlet& o, bool notes = false) {
  Delivery d;
  do {
    EXPECT_TRUE(o.pop(&d).is_ok());
  } while (!notes && d.kind == Delivery::Kind::kNote);
  return d;
}

// A buffer's payload, lent (zero-copy) or copied.
std::vector<std::byte> bytes_of(const Delivery& d) {
  if (d.view) return {d.lent.begin(), d.lent.end()};
  if (d.payload) return static_cast<VectorPayload&>(*d.payload).data();
  return {};
}

Delivery expect_buffer(Outlet& o, uint16_t device, int index, size_t n) {
  Delivery d = pop(o);
  EXPECT_EQ(d.kind, Delivery::Kind::kBuffer) << d.error.to_string();
  EXPECT_EQ(d.buffer.pts, uint64_t(index));
  EXPECT_EQ(bytes_of(d), pattern(device, index, n));
  return d;
}

// Expect: each device's stream reaches the outlet that asked for it — by name, or any sender — whole, in
// order, also when a buffer spans several blocks (256-byte blocks, 1,000-byte payloads).
TEST(SharedReceiver, RoutesEachDeviceToItsSrcAndReassembles) {
  Hub h;
  auto named = h.add("cam", 1);
  auto any = h.add("", 2);
  auto tx = connect(*h.hub, "cam", {1, 2}, 256);
  for (uint16_t d : {1, 2}) {
    ASSERT_TRUE(tx->device(d)->send(encode_caps("video/x-raw")).is_ok());
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(tx->device(d)->send(buffer_message(d, i, 1000)).is_ok());
    ASSERT_TRUE(tx->device(d)->send(encode_eos()).is_ok());
  }
  for (auto& [o, d] : {std::pair{named, uint16_t(1)}, std::pair{any, uint16_t(2)}}) {
    Delivery note = pop(*o, /*notes=*/true);
    EXPECT_EQ(note.kind, Delivery::Kind::kNote);
    Delivery c = pop(*o, /*notes=*/true);
    EXPECT_EQ(c.kind, Delivery::Kind::kCaps);
    EXPECT_EQ(c.caps, "video/x-raw");
    EXPECT_EQ(c.sender, "cam");
    for (int i = 0; i < 3; ++i) {
      Delivery b = expect_buffer(*o, d, i, 1000);
      EXPECT_TRUE(b.view.copied()) << "a buffer that spanned blocks arrives as the receiver's one copy";
    }
    EXPECT_EQ(pop(*o).kind, Delivery::Kind::kEos);
  }
  ASSERT_TRUE(tx->finish().is_ok());
}

// Expect: a message no src takes yet waits in its block (the device is paused), and arrives once one does.
TEST(SharedReceiver, AnUnclaimedDeviceWaitsForItsSrc) {
  Hub h;
  h.add("", 9);  // the receiver exists, but nothing takes device 3 yet
  auto tx = connect(*h.hub, "late", {3});
  ASSERT_TRUE(tx->device(3)->send(buffer_message(3, 0, 100)).is_ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto o = h.add("late", 3);
  expect_buffer(*o, 3, 0, 100);
  ASSERT_TRUE(tx->finish().is_ok());
}

// Expect: a src that does not keep up pauses its device; every buffer still arrives, in order.
TEST(SharedReceiver, AFullQueuePausesTheDeviceAndLosesNothing) {
  Hub h;
  auto o = h.add("slow", 0, /*capacity=*/1);
  auto tx = connect(*h.hub, "slow", {0}, 4096, /*blocks=*/2);
  constexpr int kBuffers = 6;
  std::thread producer([&] {
    for (int i = 0; i < kBuffers; ++i) EXPECT_TRUE(tx->device(0)->send(buffer_message(0, i, 2000)).is_ok());
  });
  for (int i = 0; i < kBuffers; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    expect_buffer(*o, 0, i, 2000);
  }
  producer.join();
  ASSERT_TRUE(tx->finish().is_ok());
}

// Expect: a message that is not a slotstreamsink frame ends that device's stream with an error; the
// sender's other devices go on.
TEST(SharedReceiver, AForeignMessageEndsOnlyItsStream) {
  Hub h;
  auto bad = h.add("mixed", 1);
  auto good = h.add("mixed", 2);
  auto tx = connect(*h.hub, "mixed", {1, 2});
  const std::string hello = "hello, not a frame";
  ASSERT_TRUE(tx->device(1)->send(std::as_bytes(std::span(hello))).is_ok());
  ASSERT_TRUE(tx->device(2)->send(buffer_message(2, 0, 10)).is_ok());
  Delivery d = pop(*bad);
  EXPECT_EQ(d.kind, Delivery::Kind::kError);
  EXPECT_NE(d.error.message().find("device 1 of sender 'mixed'"), std::string::npos) << d.error.message();
  EXPECT_NE(d.error.message().find("not a slotstreamsink message"), std::string::npos) << d.error.message();
  expect_buffer(*good, 2, 0, 10);
  ASSERT_TRUE(tx->finish().is_ok());
}

// Expect: a sender that finishes ends its streams (EOS); one that dies ends them with an error.
TEST(SharedReceiver, TheSendersEndEndsItsStreams) {
  Hub h;
  auto finished = h.add("fine", 0);
  auto lost = h.add("gone", 0);
  auto a = connect(*h.hub, "fine", {0});
  auto b = connect(*h.hub, "gone", {0});
  ASSERT_TRUE(a->device(0)->send(encode_caps("x")).is_ok());
  ASSERT_TRUE(b->device(0)->send(encode_caps("x")).is_ok());
  ASSERT_TRUE(a->finish().is_ok());
  b.reset();  // closed without finish(): as if the process died
  EXPECT_EQ(pop(*finished).kind, Delivery::Kind::kCaps);
  EXPECT_EQ(pop(*finished).kind, Delivery::Kind::kEos);
  EXPECT_EQ(pop(*lost).kind, Delivery::Kind::kCaps);
  Delivery d = pop(*lost);
  EXPECT_EQ(d.kind, Delivery::Kind::kError);
  EXPECT_NE(d.error.message().find("device 0 of sender 'gone': the sender was lost mid-stream"), std::string::npos)
      << d.error.message();
}

class SharedReceiverZeroCopy : public ::testing::TestWithParam<Transport> {};

// Expect: the stream's note says zero-copy; each buffer is the receive block itself — its view lies in the
// memory registered for the receive blocks, not copied, and the payload is the message's bytes after its
// 80-byte header, in place.
TEST_P(SharedReceiverZeroCopy, EachBufferIsItsReceiveBlock) {
  Hub h;
  auto o = h.add("lend", 0);
  auto tx = connect(*h.hub, "lend", {0}, 4096, 8, GetParam());
  ASSERT_TRUE(tx->device(0)->send(encode_caps("video/x-raw")).is_ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(tx->device(0)->send(buffer_message(0, i, 3000)).is_ok());
  Delivery note = pop(*o, /*notes=*/true);
  ASSERT_EQ(note.kind, Delivery::Kind::kNote);
  EXPECT_TRUE(note.zero_copy) << note.note;
  EXPECT_NE(note.note.find("receive blocks themselves"), std::string::npos) << note.note;
  EXPECT_EQ(pop(*o).kind, Delivery::Kind::kCaps);
  for (int i = 0; i < 3; ++i) {
    Delivery d = expect_buffer(*o, 0, i, 3000);
    ASSERT_TRUE(d.view);
    EXPECT_FALSE(d.payload) << "nothing copied";
    EXPECT_FALSE(d.view.copied());
    EXPECT_TRUE(d.view.in_registered_memory()) << "the view lies in the receive region";
    EXPECT_EQ(d.lent.data(), d.view.data().data() + kBufferHeaderSize);
    EXPECT_EQ(d.lent.size(), 3000u);
  }
  ASSERT_TRUE(tx->finish().is_ok());
}

// Expect: a buffer downstream keeps holds its block: its bytes stay as they were while 24 more buffers flow
// through the same 8 blocks (and reach the src whole).
TEST_P(SharedReceiverZeroCopy, AHeldBufferStaysIntactAsMoreFlow) {
  Hub h;
  auto o = h.add("hold", 0);
  auto tx = connect(*h.hub, "hold", {0}, 4096, 8, GetParam());
  std::thread producer([&] {
    for (int i = 0; i < 25; ++i) EXPECT_TRUE(tx->device(0)->send(buffer_message(0, i, 3000)).is_ok());
  });
  Delivery held = expect_buffer(*o, 0, 0, 3000);
  ASSERT_TRUE(held.view && !held.view.copied());
  for (int i = 1; i < 25; ++i) expect_buffer(*o, 0, i, 3000);  // released as each goes out of scope
  producer.join();
  EXPECT_EQ(bytes_of(held), pattern(0, 0, 3000)) << "the held block was not written";
  ASSERT_TRUE(tx->finish().is_ok());
}

INSTANTIATE_TEST_SUITE_P(Transports, SharedReceiverZeroCopy, ::testing::Values(Transport::kShm, Transport::kTcp),
                         [](const auto& info) { return std::string(transport_name(info.param)); });

// Expect: buffers downstream keeps (2) and buffers queued for the src hold all 4 blocks; the sender then waits
// for a free block instead of finishing, and once they are released every buffer arrives, in order.
TEST(SharedReceiver, HeldBuffersAtTheLimitPauseTheSenderAndLoseNothing) {
  Hub h;
  auto o = h.add("deep", 0, /*capacity=*/32);
  auto tx = connect(*h.hub, "deep", {0}, 4096, /*blocks=*/4);
  constexpr int kBuffers = 14;
  std::atomic<int> sent = 0;
  std::thread producer([&] {
    for (int i = 0; i < kBuffers; ++i) {
      EXPECT_TRUE(tx->device(0)->send(buffer_message(0, i, 3000)).is_ok());
      ++sent;
    }
  });
  std::vector<Delivery> kept;
  for (int i = 0; i < 2; ++i) kept.push_back(expect_buffer(*o, 0, i, 3000));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_LT(sent.load(), kBuffers) << "the sender waits while downstream holds the limit";
  kept.clear();  // downstream lets go
  for (int i = 2; i < kBuffers; ++i) expect_buffer(*o, 0, i, 3000);
  producer.join();
  ASSERT_TRUE(tx->finish().is_ok());
}

// Expect: zero-copy=off copies each buffer once (the block is not held) and its note says so.
TEST(SharedReceiver, ZeroCopyOffCopies) {
  Hub h;
  auto o = h.add("copy", 0, 4, ZeroCopy::kOff);
  auto tx = connect(*h.hub, "copy", {0});
  ASSERT_TRUE(tx->device(0)->send(buffer_message(0, 0, 3000)).is_ok());
  Delivery note = pop(*o, /*notes=*/true);
  EXPECT_FALSE(note.zero_copy);
  EXPECT_NE(note.note.find("zero-copy=off"), std::string::npos) << note.note;
  Delivery d = expect_buffer(*o, 0, 0, 3000);
  EXPECT_FALSE(d.view);
  EXPECT_TRUE(d.payload);
  ASSERT_TRUE(tx->finish().is_ok());
}

// Expect: a sender whose protocol cannot lend blocks is still received (copied once), and the note says why;
// a src with zero-copy=on ends its stream with an error that says what to change instead.
TEST(SharedReceiver, ASenderThatCannotLendIsCopiedAndSaysWhy) {
  Hub h;
  auto any = h.add("window", 0);
  auto strict = h.add("window", 1, 4, ZeroCopy::kOn);
  auto tx = connect(*h.hub, "window", {0, 1}, 4096, 8, Transport::kShm, "sliding_window");
  ASSERT_TRUE(tx->device(0)->send(buffer_message(0, 0, 3000)).is_ok());
  ASSERT_TRUE(tx->device(1)->send(buffer_message(1, 0, 3000)).is_ok());
  Delivery note = pop(*any, /*notes=*/true);
  ASSERT_EQ(note.kind, Delivery::Kind::kNote);
  EXPECT_FALSE(note.zero_copy);
  EXPECT_NE(note.note.find("uses protocol sliding_window, which cannot lend receive blocks"), std::string::npos)
      << note.note;
  Delivery d = expect_buffer(*any, 0, 0, 3000);
  EXPECT_FALSE(d.view);
  Delivery e = pop(*strict, /*notes=*/true);
  ASSERT_EQ(e.kind, Delivery::Kind::kError);
  EXPECT_NE(e.error.message().find("device 1 of sender 'window': zero-copy=on, but sender 'window' uses protocol "
                                   "sliding_window"),
            std::string::npos)
      << e.error.message();
}

TEST(SharedReceiver, RefusesASecondSrcForTheSameStream) {
  Hub h;
  h.add("cam", 1);
  std::shared_ptr<ReceiverHub> other;
  Status st = ReceiverHub::attach("127.0.0.1:0", "", make_outlet("cam", 1), &other);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("already takes device 1 of sender 'cam'"), std::string::npos) << st.message();
  st = ReceiverHub::attach("127.0.0.1:0", "secret", make_outlet("cam", 2), &other);
  EXPECT_NE(st.message().find("different token-file"), std::string::npos) << st.message();
}

TEST(SharedReceiver, FlushingWakesAWaitingSrc) {
  auto o = make_outlet("", 0);
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    o->set_flushing(true);
  });
  Delivery d;
  EXPECT_EQ(o->pop(&d).code(), Code::kCancelled);
  t.join();
}

}  // namespace
}  // namespace slotstream::gst
