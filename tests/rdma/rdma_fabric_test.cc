// The fabric over a real verbs stack: Soft-RoCE (rdma_rxe) in the VM of scripts/softroce-vm.sh, where
// UCX has rc_verbs and ud_verbs on rxe0:1 at 10.9.0.1. Built as `rdma_tests`, run by tests/rdma/in_vm.sh
// only (not by CTest: no machine it runs on has an RDMA device). Each test fails without a device.
//
// What is checked here, below the CLI (tests/rdma/test_*.py check the rest as a user meets it):
// an endpoint connects through rdmacm and says which lanes UCX chose; a get dropped while the NIC
// still answers it cannot write into memory its owner frees next; a peer that is gone is an error
// at once, never a UCX abort; what a connected worker pins is within the fabric's estimate; a low
// locked-memory limit is one clear error before UCX pins anything.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/ucx/fabric/fabric.h"

namespace slotstream::fabric {
namespace {

// Where both ends of every connection meet in the VM (rxe0 on dummy0).
constexpr const char* kHost = "10.9.0.1";

// kB pinned by this process (the kernel's count that RLIMIT_MEMLOCK limits).
uint64_t vm_pin_bytes() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("VmPin:")) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

// Endpoint::create(from, to's address) while a helper thread progresses `to` (its listener
// accepts the connection), as the peer process would.
Status connect_pair(Worker& from, Worker& to, std::unique_ptr<Endpoint>* out) {
  std::atomic<bool> done{false};
  std::thread helper([&] {
    while (!done.load()) to.progress_setup();
  });
  Status st = Endpoint::create(from, to.address(), kHost, out);
  done.store(true);
  helper.join();
  return st;
}

struct Pair {
  std::unique_ptr<Context> ctx;
  std::unique_ptr<Worker> initiator, target;
  std::unique_ptr<Endpoint> ep;
  Status open(RdmaTransport kind = RdmaTransport::kRc) {
    SLOTSTREAM_RETURN_IF_ERROR(Context::create(FabricSpec{Transport::kRdma, kind}, &ctx));
    SLOTSTREAM_RETURN_IF_ERROR(Worker::create(*ctx, /*shared=*/false, /*wakeup=*/true, &initiator));
    SLOTSTREAM_RETURN_IF_ERROR(Worker::create(*ctx, /*shared=*/true, /*wakeup=*/true, &target));
    return connect_pair(*initiator, *target, &ep);
  }
};

TEST(RdmaFabric, ThisHostHasTheSoftRoceDevice) {
  const RdmaReport& r = host_rdma({Transport::kRdma, RdmaTransport::kRc});
  ASSERT_TRUE(r.usable) << r.why << " (run inside scripts/softroce-vm.sh)";
  EXPECT_NE(r.why.find("rc_verbs"), std::string::npos) << r.why;
}

// rc: an endpoint through rdmacm whose puts and gets the NIC carries (a lane for RMA on rc_verbs).
TEST(RdmaFabric, AnRcEndpointPutsAndGetsInTheNic) {
  Pair p;
  ASSERT_TRUE(p.open().is_ok());
  EXPECT_NE(p.ep->lanes().find("rc_verbs/rxe0:1"), std::string::npos) << p.ep->lanes();
  EXPECT_NE(p.ep->lanes().find("rma"), std::string::npos) << p.ep->lanes();
  EXPECT_EQ(p.ep->lanes().find("ud_verbs"), std::string::npos) << "rc asks for no ud lane: " << p.ep->lanes();
  EXPECT_TRUE(p.ep->rma_one_sided());
  ExposedRegion region;
  ASSERT_TRUE(MemoryRegion::allocate_exposed(*p.ctx, 1 << 20, &region).is_ok());
  std::unique_ptr<RemoteKey> key;
  ASSERT_TRUE(RemoteKey::unpack(*p.ep, region.rkey, &key).is_ok());
  // Shared memory's mapping (RemoteKey) is not taken here: an rc key maps nothing into this process.
  EXPECT_FALSE(key->mapped(region.region->remote_address())) << "puts would bypass the NIC";
  std::vector<uint8_t> data(1 << 20);
  for (size_t i = 0; i < data.size(); ++i) data[i] = uint8_t(i * 7 + 3);
  const auto alive = [] { return Status::ok(); };
  Request put;
  ASSERT_TRUE(p.ep->put(data.data(), data.size(), region.region->remote_address(), *key, &put).is_ok());
  ASSERT_TRUE(put.wait(*p.initiator, alive).is_ok());
  ASSERT_TRUE(p.ep->flush(alive).is_ok());
  EXPECT_EQ(std::memcmp(region.region->data(), data.data(), data.size()), 0);
  std::vector<uint8_t> back(data.size());
  Request get;
  ASSERT_TRUE(p.ep->get(back.data(), back.size(), region.region->remote_address(), *key, &get).is_ok());
  ASSERT_TRUE(get.wait(*p.initiator, alive).is_ok());
  EXPECT_EQ(back, data);
}

// A user's UCX_TLS without an rc transport: the endpoint says its puts are not one-sided (the
// sender refuses a passive protocol over it: tests/rdma/test_transfer.py).
TEST(RdmaFabric, UdLanesAreNotOneSided) {
  Pair p;
  ASSERT_TRUE(p.open(RdmaTransport::kUd).is_ok());
  EXPECT_NE(p.ep->lanes().find("ud_verbs"), std::string::npos) << p.ep->lanes();
  EXPECT_FALSE(p.ep->rma_one_sided()) << p.ep->lanes();
}

// A get still running when its request is dropped (its wait failed: the peer or the sender is
// gone) ends before the drop returns, so that its destination may be freed: the NIC writes
// nothing into it afterwards. Without that, the 8 MiB read below went on landing in a buffer the
// test had already cleared (Soft-RoCE reads at tens of MB/s in the VM: the read outlives the drop).
TEST(RdmaFabric, AGetDroppedWhileRunningWritesNothingAfterwards) {
  Pair p;
  ASSERT_TRUE(p.open().is_ok());
  constexpr size_t kSize = 8 << 20;
  ExposedRegion region;
  ASSERT_TRUE(MemoryRegion::allocate_exposed(*p.ctx, kSize, &region).is_ok());
  std::memset(region.region->data(), 0xab, kSize);
  std::unique_ptr<RemoteKey> key;
  ASSERT_TRUE(RemoteKey::unpack(*p.ep, region.rkey, &key).is_ok());
  std::vector<uint8_t> dst(kSize, 0);
  bool was_pending = false;
  {
    Request get;
    ASSERT_TRUE(p.ep->get(dst.data(), kSize, region.region->remote_address(), *key, &get).is_ok());
    was_pending = get.pending();
  }  // dropped while running
  ASSERT_TRUE(was_pending) << "an 8 MiB read over Soft-RoCE completed inside the call: nothing was tested";
  EXPECT_TRUE(p.ep->failed()) << "the endpoint was closed to end the read";
  EXPECT_NE(p.ep->failure().message().find("abandoned"), std::string::npos) << p.ep->failure().message();
  std::memset(dst.data(), 0, kSize);  // the owner reuses (or frees) the destination now
  for (const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
       std::chrono::steady_clock::now() < until;) {
    p.initiator->progress();
    p.target->progress();
  }
  EXPECT_EQ(std::count(dst.begin(), dst.end(), 0), ptrdiff_t(kSize)) << "the dropped read wrote into the buffer";
}

// The peer's worker is gone (its process died after sending its address): connecting is an
// error within the fabric's time limits, never a hang and never UCX aborting the process.
TEST(RdmaFabric, APeerThatIsGoneIsAnErrorNotAnAbort) {
  std::unique_ptr<Context> ctx;
  ASSERT_TRUE(Context::create(FabricSpec{Transport::kRdma}, &ctx).is_ok());
  std::unique_ptr<Worker> a, b;
  ASSERT_TRUE(Worker::create(*ctx, false, true, &a).is_ok());
  ASSERT_TRUE(Worker::create(*ctx, true, true, &b).is_ok());
  const std::vector<uint8_t> address = b->address();
  b.reset();
  std::unique_ptr<Endpoint> ep;
  const auto t0 = std::chrono::steady_clock::now();
  Status st = Endpoint::create(*a, address, kHost, &ep);
  EXPECT_FALSE(st.is_ok());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, Endpoint::kConnectTimeout + std::chrono::seconds(5));
  EXPECT_EQ(ep, nullptr);
  std::printf("connecting to a worker that is gone: %s\n", st.to_string().c_str());
}

// What a connected rc worker pins (its receive queue and buffers, registered once its first
// endpoint connects) is within the fabric's estimate, worker_pinned_bytes: the locked-memory
// checks add that much per worker.
TEST(RdmaFabric, AConnectedWorkerPinsNoMoreThanTheEstimate) {
  const uint64_t before = vm_pin_bytes();
  Pair p;
  ASSERT_TRUE(p.open().is_ok());
  ExposedRegion region;
  ASSERT_TRUE(MemoryRegion::allocate_exposed(*p.ctx, 4 << 20, &region).is_ok());
  std::unique_ptr<RemoteKey> key;
  ASSERT_TRUE(RemoteKey::unpack(*p.ep, region.rkey, &key).is_ok());
  std::vector<uint8_t> data(1 << 20, 1);
  Request put;
  ASSERT_TRUE(p.ep->put(data.data(), data.size(), region.region->remote_address(), *key, &put).is_ok());
  ASSERT_TRUE(p.ep->flush([] { return Status::ok(); }).is_ok());
  put = Request();
  const uint64_t pinned = vm_pin_bytes() - before;
  const uint64_t estimate = pinned_estimate();
  std::printf("two connected rc workers and 4 MiB of regions pin %.1f MiB (VmPin); the fabric estimates %.1f MiB\n",
              pinned / 1048576.0, estimate / 1048576.0);
  EXPECT_GT(pinned, uint64_t(4) << 20) << "nothing pinned: is this Soft-RoCE?";
  EXPECT_LE(pinned, estimate);
}

// Under a low locked-memory limit and without CAP_IPC_LOCK, a worker or a region that would not
// fit is refused before UCX registers anything, naming the limit (no "ibv_reg_mr failed" from UCX).
TEST(RdmaFabric, ALowLockedMemoryLimitIsOneClearErrorBeforeUcxPins) {
  std::unique_ptr<Context> ctx;
  ASSERT_TRUE(Context::create(FabricSpec{Transport::kRdma}, &ctx).is_ok());
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    rlimit rl{16 << 20, 16 << 20};
    // Giving up root gives up CAP_IPC_LOCK, which would lock any amount.
    if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0 || setresgid(65534, 65534, 65534) != 0 ||
        setresuid(65534, 65534, 65534) != 0) {
      _exit(3);
    }
    std::unique_ptr<Worker> w;
    Status st = Worker::create(*ctx, false, true, &w);
    const bool worker_refused =
        st.code() == Code::kInvalidArgument &&
        st.message().find("the locked-memory limit (ulimit -l) is 16.0 MiB") != std::string::npos;
    std::unique_ptr<MemoryRegion> r;
    st = MemoryRegion::allocate(*ctx, 32 << 20, &r);
    const bool region_refused =
        st.code() == Code::kInvalidArgument && st.message().find("16.0 MiB") != std::string::npos;
    _exit(worker_refused && region_refused ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: not refused, or the limit not named; 3: could not set the child up";
}

}  // namespace
}  // namespace slotstream::fabric
