// An initiator worker and a target worker of one context in one process, over real UCX: the
// initiator has an endpoint to the target and a key to a 1 MiB region the target registered.
// The test drives the initiator itself; serve() starts the target's progress thread (what a
// receiver runs on tcp; on shared memory it only serves wire-up).
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "connect.h"
#include "engine/ucx/fabric/fabric.h"

namespace slotstream::fabric {

class Loopback : public testing::Test {
 protected:
  void open(Transport transport) {
    ASSERT_TRUE(Context::create(transport, &ctx_).is_ok());
    ASSERT_TRUE(Worker::create(*ctx_, /*shared=*/false, /*wakeup=*/false, &initiator_).is_ok());
    ASSERT_TRUE(Worker::create(*ctx_, /*shared=*/true, /*wakeup=*/true, &target_).is_ok());
    ASSERT_TRUE(connect_pair(*initiator_, *target_, &ep_).is_ok());
    ASSERT_TRUE(MemoryRegion::allocate(*ctx_, kRegion, &region_).is_ok());
    ASSERT_TRUE(region_->pack_rkey(&packed_).is_ok());
    ASSERT_TRUE(RemoteKey::unpack(*ep_, packed_, &rkey_).is_ok());
  }
  void TearDown() override {
    progress_.reset();
    rkey_.reset();
    ep_.reset();
  }
  void serve() { progress_ = std::make_unique<ProgressThread>(*target_); }
  Status wait(Request& r) {
    return r.wait(*initiator_, [] { return Status::ok(); });
  }
  Status flush() {
    return ep_->flush([] { return Status::ok(); });
  }
  uint64_t remote(size_t offset) const { return region_->remote_address() + offset; }

  static constexpr size_t kRegion = 1 << 20;
  std::unique_ptr<Context> ctx_;
  std::unique_ptr<Worker> initiator_, target_;
  std::unique_ptr<Endpoint> ep_;
  std::unique_ptr<MemoryRegion> region_;
  std::vector<uint8_t> packed_;
  std::unique_ptr<RemoteKey> rkey_;
  std::unique_ptr<ProgressThread> progress_;
};

}  // namespace slotstream::fabric
