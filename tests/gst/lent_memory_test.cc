// slotstreamsrc's zero-copy buffer (gst/lent_memory.h) over real lent views — the shared receiver over shm and tcp
// in one process: the buffer's memory is the receive block itself, read-only, and its last unref (on another
// thread) gives the block back.
#include "lent_memory.h"

#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "gst_test_support.h"

namespace slotstream::gst {
namespace {

using testing::connect;
using testing::make_outlet;
using testing::pattern;

class LentMemory : public ::testing::TestWithParam<Transport> {
 protected:
  static void SetUpTestSuite() { gst_init(nullptr, nullptr); }
};

Delivery next_buffer(Outlet& o) {
  Delivery d;
  do {
    EXPECT_TRUE(o.pop(&d).is_ok());
  } while (d.kind == Delivery::Kind::kNote);
  EXPECT_EQ(d.kind, Delivery::Kind::kBuffer) << d.error.to_string();
  return d;
}

// Whether a delivery arrives within `wait` (flushing wakes the pop otherwise).
bool arrives_within(Outlet& o, std::chrono::milliseconds wait, Delivery* d) {
  std::thread flush([&] {
    std::this_thread::sleep_for(wait);
    o.set_flushing(true);
  });
  const bool got = o.pop(d).is_ok();
  flush.join();
  o.set_flushing(false);
  return got;
}

// Expect: the GstBuffer's memory is the view's payload where it lies in the registered receive region (mapped at
// that address, not copied) and read-only — a write map gets a copy and the block keeps its bytes. While it lives
// its block is held: with 2 blocks, one held by the buffer and one by the next message (queued), a third message
// finds no free block. The buffer's last unref, on another thread, gives its block back, and the third arrives.
TEST_P(LentMemory, TheBufferIsTheReceiveBlockUntilItsLastUnref) {
  auto outlet = make_outlet("mem", 0, 8);
  std::shared_ptr<ReceiverHub> hub;
  ASSERT_TRUE(ReceiverHub::attach("127.0.0.1:0", "", outlet, &hub).is_ok());
  auto tx = connect(*hub, "mem", {0}, 4096, /*blocks=*/2, GetParam());
  std::thread producer([&] {
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(tx->device(0)->send(testing::buffer_message(0, i, 3000)).is_ok());
  });

  Delivery d = next_buffer(*outlet);
  ASSERT_TRUE(d.view && !d.view.copied());
  ASSERT_TRUE(d.view.in_registered_memory());
  const std::byte* where = d.lent.data();
  GstBuffer* buf = wrap_lent(std::move(d.view), d.lent);
  GstMemory* mem = gst_buffer_get_memory(buf, 0);  // a second reference, as a sub-buffer downstream would hold
  EXPECT_TRUE(GST_MEMORY_IS_READONLY(mem));
  GstMapInfo info;
  ASSERT_TRUE(gst_memory_map(mem, &info, GST_MAP_READ));
  EXPECT_EQ(reinterpret_cast<const std::byte*>(info.data), where) << "mapped in place, not copied";
  EXPECT_EQ(std::vector<std::byte>(where, where + info.size), pattern(0, 0, 3000));
  gst_memory_unmap(mem, &info);

  ASSERT_TRUE(gst_buffer_map(buf, &info, GST_MAP_WRITE));  // a writer gets its own copy
  EXPECT_NE(reinterpret_cast<const std::byte*>(info.data), where);
  std::memset(info.data, 0xff, info.size);
  gst_buffer_unmap(buf, &info);
  EXPECT_EQ(std::vector<std::byte>(where, where + 3000), pattern(0, 0, 3000)) << "the block was not written";

  Delivery second = next_buffer(*outlet);  // kept: its block stays held too
  ASSERT_TRUE(second.view);
  Delivery third;
  EXPECT_FALSE(arrives_within(*outlet, std::chrono::milliseconds(300), &third)) << "no free block for it yet";
  std::thread([&] {
    gst_buffer_unref(buf);
    gst_memory_unref(mem);  // the last reference: the block is given back, from this thread
  }).join();
  third = next_buffer(*outlet);
  EXPECT_EQ(third.buffer.pts, 2u);
  GstBuffer* again = wrap_lent(std::move(third.view), third.lent);
  EXPECT_EQ(gst_buffer_get_size(again), 3000u);
  gst_buffer_unref(again);
  second.view.release();
  producer.join();
  ASSERT_TRUE(tx->finish().is_ok());
  hub->detach(outlet);
}

INSTANTIATE_TEST_SUITE_P(Transports, LentMemory, ::testing::Values(Transport::kShm, Transport::kTcp),
                         [](const auto& info) { return std::string(transport_name(info.param)); });

}  // namespace
}  // namespace slotstream::gst
