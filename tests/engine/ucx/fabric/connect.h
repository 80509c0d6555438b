// Connecting two workers of one test process: over tcp an endpoint connects through the peer
// worker's listener (src/engine/ucx/fabric/cm.h) and Endpoint::create waits until the connection stands,
// which needs the peer worker progressed meanwhile — here by a helper thread, as a peer process
// would. (On shared memory nothing waits.)
#pragma once

#include <atomic>
#include <memory>
#include <thread>

#include "engine/ucx/fabric/fabric.h"

namespace slotstream::fabric {

// Endpoint::create(from, to's address) while a helper thread progresses `to` (which no other
// thread may use meanwhile).
inline Status connect_pair(Worker& from, Worker& to, std::unique_ptr<Endpoint>* out) {
  std::atomic<bool> done{false};
  std::thread helper([&] {
    while (!done.load()) to.progress();
  });
  Status st = Endpoint::create(from, to.address(), "127.0.0.1", out);
  done.store(true);
  helper.join();
  return st;
}

}  // namespace slotstream::fabric
