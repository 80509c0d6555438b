// The fabric's pure decisions per transport (src/engine/ucx/fabric/transports.h): what UCX is asked for under
// a given environment, how each transport behaves, whether rdma can run given what UCX and sysfs
// report, and the locked-memory check. No NIC is needed: the inputs are built here, shaped as UCX
// 1.13 reports them (uct_md_query_tl_resources: tl name, device "mlx5_0:1").
#include "engine/ucx/fabric/transports.h"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <map>

namespace slotstream::fabric {
namespace {

// An environment of our own instead of the process's.
Getenv env_of(std::map<std::string, std::string> vars) {
  auto held = std::make_shared<std::map<std::string, std::string>>(std::move(vars));
  return [held](const char* name) -> const char* {
    auto it = held->find(name);
    return it == held->end() ? nullptr : it->second.c_str();
  };
}

std::map<std::string, std::string> applied(const UcxChoice& c) {
  std::map<std::string, std::string> out;
  for (const auto& s : c.apply) out[s.env] = s.value;
  return out;
}

TEST(Transports, UcxIsAskedForEachTransportsOwnTransports) {
  const auto none = env_of({});
  // Every transport: regions from UCX's zero-filled allocators only (no "heap" or "thp": a region is then
  // never cleared, and costs what is written).
  const std::string zero_filled = "md:sysv,md:posix,huge,md:*,mmap";
  EXPECT_EQ(applied(ucx_settings({Transport::kShm}, none)),
            (std::map<std::string, std::string>{{"UCX_TLS", "posix,sysv,self"}, {"UCX_ALLOC_PRIO", zero_filled}}));
  // tcp: connections through tcp's own connection manager on one device (engine/ucx/fabric/cm.h).
  EXPECT_EQ(applied(ucx_settings({Transport::kTcp}, none)),
            (std::map<std::string, std::string>{{"UCX_TLS", "tcp,self"},
                                                {"UCX_TCP_TX_SEG_SIZE", "1028K"},
                                                {"UCX_TCP_RX_SEG_SIZE", "2056K"},
                                                {"UCX_CM_USE_ALL_DEVICES", "n"},
                                                {"UCX_SOCKADDR_TLS_PRIORITY", "tcp"},
                                                {"UCX_ALLOC_PRIO", zero_filled}}));
  // rdma rc: the rc transports this host has, no ud (connections through rdmacm, engine/ucx/fabric/cm.h),
  // strict PCIe ordering for write-then-status.
  const std::vector<std::string> rxe = {"self", "tcp", "posix", "rc_verbs", "ud_verbs"};
  const std::map<std::string, std::string> rc_on_rxe = {{"UCX_TLS", "rc_verbs,self"},
                                                        {"UCX_SOCKADDR_TLS_PRIORITY", "rdmacm"},
                                                        {"UCX_CM_USE_ALL_DEVICES", "n"},
                                                        {"UCX_IB_PCI_RELAXED_ORDERING", "off"},
                                                        {"UCX_ALLOC_PRIO", zero_filled}};
  EXPECT_EQ(applied(ucx_settings({Transport::kRdma, RdmaTransport::kRc}, none, rxe)), rc_on_rxe);
  const std::vector<std::string> connectx = {"self", "rc_verbs", "ud_verbs", "rc_mlx5", "dc_mlx5", "ud_mlx5"};
  EXPECT_EQ(applied(ucx_settings({Transport::kRdma, RdmaTransport::kRc}, none, connectx))["UCX_TLS"],
            "rc_mlx5,rc_verbs,self");
  // Where ud may carry something (ud itself, dc's and the "rc" alias's ud ":aux"), UCX 1.13's
  // ud_verbs must not drop every IPv4 RoCE packet (its destination check, transports.cc).
  auto rc_unknown = applied(ucx_settings({Transport::kRdma, RdmaTransport::kRc}, none));
  EXPECT_EQ(rc_unknown["UCX_TLS"], "rc,self") << "no host list: UCX's alias";
  EXPECT_EQ(rc_unknown["UCX_UD_ETH_DGID_CHECK"], "n");
  for (RdmaTransport kind : {RdmaTransport::kDc, RdmaTransport::kUd}) {
    const auto a = applied(ucx_settings({Transport::kRdma, kind}, none, connectx));
    EXPECT_EQ(a.at("UCX_TLS"), kind == RdmaTransport::kDc ? "dc,self" : "ud,self");
    EXPECT_EQ(a.at("UCX_UD_ETH_DGID_CHECK"), "n");
    EXPECT_EQ(a.at("UCX_SOCKADDR_TLS_PRIORITY"), "rdmacm");
    EXPECT_EQ(a.at("UCX_IB_PCI_RELAXED_ORDERING"), "off");
  }
  // --rdma-device is UCX's net device list.
  EXPECT_EQ(
      applied(ucx_settings({Transport::kRdma, RdmaTransport::kRc, "mlx5_1:1"}, none, connectx))["UCX_NET_DEVICES"],
      "mlx5_1:1");
  // The key is what ucp_config_modify takes: without UCX_, and a transport's (or a component's) own
  // without its prefix (UCX_TCP_TX_SEG_SIZE -> TX_SEG_SIZE, UCX_IB_PCI_RELAXED_ORDERING ->
  // PCI_RELAXED_ORDERING; UCX_UD_ETH_DGID_CHECK keeps UD_: ud_verbs' table nests the ud table under it).
  for (const FabricSpec& spec : {FabricSpec{Transport::kTcp}, FabricSpec{Transport::kRdma, RdmaTransport::kUd}}) {
    for (const auto& s : ucx_settings(spec, none).apply) {
      const std::string prefix = s.env.starts_with("UCX_TCP_")  ? "UCX_TCP_"
                                 : s.env.starts_with("UCX_IB_") ? "UCX_IB_"
                                                                : "UCX_";
      EXPECT_EQ(s.key, s.env.substr(prefix.size()));
    }
  }
  for (const auto* t : {"shm", "tcp"}) EXPECT_TRUE(ucx_settings({*parse_transport(t)}, none).overridden.empty());
}

TEST(Transports, AUsersUcxEnvironmentWinsAndIsReported) {
  const auto env = env_of({{"UCX_TLS", "rc_verbs,ud_verbs:aux"}, {"UCX_NET_DEVICES", "mlx5_0:1"}});
  const std::vector<std::string> host = {"rc_verbs"};
  const UcxChoice c = ucx_settings({Transport::kRdma, RdmaTransport::kRc, "mlx5_1:1"}, env, host);
  const auto a = applied(c);
  EXPECT_EQ(a.count("UCX_TLS"), 0u) << "nothing of ours where the environment decides";
  EXPECT_EQ(a.count("UCX_NET_DEVICES"), 0u);
  EXPECT_EQ(a.at("UCX_UD_ETH_DGID_CHECK"), "n") << "a user's UCX_TLS may bring ud";
  ASSERT_EQ(c.overridden.size(), 2u);
  EXPECT_EQ(c.overridden[0], "UCX_TLS=rc_verbs,ud_verbs:aux from the environment (slotstream would use rc_verbs,self)");
  EXPECT_EQ(c.overridden[1], "UCX_NET_DEVICES=mlx5_0:1 from the environment (slotstream would use mlx5_1:1)");
  // A setting UCX also takes under a transport's own name: the user's choice all the same.
  const UcxChoice d =
      ucx_settings({Transport::kRdma, RdmaTransport::kUd}, env_of({{"UCX_UD_VERBS_ETH_DGID_CHECK", "y"}}));
  EXPECT_EQ(applied(d).count("UCX_UD_ETH_DGID_CHECK"), 0u);
  EXPECT_EQ(d.overridden,
            std::vector<std::string>{"UCX_UD_ETH_DGID_CHECK=y from the environment (slotstream would use n)"});
  // A tcp segment size of the user's stays, the other is still ours; the same value is no override.
  const UcxChoice t =
      ucx_settings({Transport::kTcp}, env_of({{"UCX_TCP_TX_SEG_SIZE", "64k"}, {"UCX_TLS", "tcp,self"}}));
  EXPECT_EQ(applied(t).count("UCX_TCP_TX_SEG_SIZE"), 0u);
  EXPECT_EQ(applied(t).at("UCX_TCP_RX_SEG_SIZE"), "2056K");
  EXPECT_EQ(t.overridden,
            std::vector<std::string>{"UCX_TCP_TX_SEG_SIZE=64k from the environment (slotstream would use 1028K)"});
}

TEST(Transports, TheFabricKnowsWhichTransportsNeedTheTargetsProgress) {
  // The passivity table of docs/rdma.md: who carries RMA, who must progress the target.
  struct Row {
    FabricSpec spec;
    bool soft_rma, target_progress, peer_errors, setup_progress, registers_memory, cm_connect;
  };
  const Row rows[] = {
      {{Transport::kShm}, false, false, false, false, false, false},
      {{Transport::kTcp}, true, true, true, false, false, true},
      {{Transport::kRdma, RdmaTransport::kRc}, false, false, true, true, true, true},
      {{Transport::kRdma, RdmaTransport::kDc}, false, false, true, true, true, true},
      {{Transport::kRdma, RdmaTransport::kUd}, false, true, true, true, true, true},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(spec_name(r.spec));
    const TransportTraits t = traits(r.spec);
    EXPECT_EQ(t.soft_rma, r.soft_rma);
    EXPECT_EQ(t.target_progress, r.target_progress);
    EXPECT_EQ(t.peer_errors, r.peer_errors);
    EXPECT_EQ(t.setup_progress, r.setup_progress);
    EXPECT_EQ(t.registers_memory, r.registers_memory);
    EXPECT_EQ(t.cm_connect, r.cm_connect);
  }
  EXPECT_EQ(spec_name({Transport::kRdma, RdmaTransport::kUd}), "rdma:ud");
  EXPECT_EQ(spec_name({Transport::kTcp}), "tcp");
}

// What UCX 1.13 lists on a host with one ConnectX port (RoCE) and what sysfs says about it.
const UcxResource kConnectX[] = {{"self", "memory0"},      {"tcp", "eth0"},          {"posix", "memory"},
                                 {"rc_verbs", "mlx5_0:1"}, {"ud_verbs", "mlx5_0:1"}, {"rc_mlx5", "mlx5_0:1"},
                                 {"dc_mlx5", "mlx5_0:1"},  {"ud_mlx5", "mlx5_0:1"}};
const SysfsPort kConnectXPorts[] = {{"mlx5_0:1", "ACTIVE", "Ethernet"}, {"mlx5_0:2", "DOWN", "Ethernet"}};

TEST(Transports, RdmaIsUsableWhereUcxOffersTheRdmaTransportOnTheWantedPort) {
  RdmaReport r = rdma_report(kConnectX, kConnectXPorts, {Transport::kRdma, RdmaTransport::kRc});
  EXPECT_TRUE(r.usable) << r.why;
  EXPECT_EQ(r.why, "rc on mlx5_0:1 rc_mlx5");
  ASSERT_EQ(r.ports.size(), 2u);  // UCX's active port, and the down one sysfs shows
  EXPECT_EQ(r.ports[0].name, "mlx5_0:1");
  EXPECT_EQ(r.ports[0].state, "ACTIVE");
  EXPECT_EQ(r.ports[0].link_layer, "Ethernet");
  EXPECT_EQ(r.ports[0].ucx_transports,
            (std::vector<std::string>{"dc_mlx5", "rc_mlx5", "rc_verbs", "ud_mlx5", "ud_verbs"}));
  EXPECT_EQ(r.ports[1].name, "mlx5_0:2");
  EXPECT_TRUE(r.ports[1].ucx_transports.empty());
  EXPECT_TRUE(rdma_report(kConnectX, kConnectXPorts, {Transport::kRdma, RdmaTransport::kDc}).usable);
  EXPECT_TRUE(rdma_report(kConnectX, kConnectXPorts, {Transport::kRdma, RdmaTransport::kUd, "mlx5_0:1"}).usable);
}

TEST(Transports, WhyRdmaCannotRunSaysWhatIsMissing) {
  // Nothing at all (this machine).
  const UcxResource no_nic[] = {{"self", "memory0"}, {"tcp", "eth0"}, {"posix", "memory"}};
  RdmaReport r = rdma_report(no_nic, {}, {Transport::kRdma});
  EXPECT_FALSE(r.usable);
  EXPECT_EQ(r.why, "no RDMA device (UCX reports none and /sys/class/infiniband is empty)");
  EXPECT_TRUE(r.ports.empty());
  // A port the kernel has but UCX does not use (down).
  r = rdma_report(no_nic, kConnectXPorts, {Transport::kRdma});
  EXPECT_FALSE(r.usable);
  EXPECT_EQ(r.why.rfind("no RDMA device offers rc (mlx5_0:1 (ACTIVE Ethernet): UCX offers nothing; mlx5_0:2 (DOWN "
                        "Ethernet): UCX offers nothing): a port must be ACTIVE",
                        0),
            0u)
      << r.why;
  // A port that is not there.
  r = rdma_report(kConnectX, kConnectXPorts, {Transport::kRdma, RdmaTransport::kRc, "mlx5_3:1"});
  EXPECT_FALSE(r.usable);
  EXPECT_EQ(r.why, "RDMA device mlx5_3:1 not found (this host has mlx5_0:1, mlx5_0:2)");
  // dc on a NIC without it (verbs only).
  const UcxResource verbs_only[] = {{"rc_verbs", "qedr0:1"}, {"ud_verbs", "qedr0:1"}};
  r = rdma_report(verbs_only, {}, {Transport::kRdma, RdmaTransport::kDc});
  EXPECT_FALSE(r.usable);
  EXPECT_EQ(r.why,
            "no RDMA device offers dc (qedr0:1: UCX offers rc_verbs, ud_verbs): dc needs a ConnectX (mlx5) NIC; use "
            "--rdma-transport rc");
  EXPECT_TRUE(rdma_report(verbs_only, {}, {Transport::kRdma, RdmaTransport::kRc}).usable);
  // A device list (UCX_NET_DEVICES' form) and "all".
  EXPECT_TRUE(rdma_report(kConnectX, {}, {Transport::kRdma, RdmaTransport::kRc, "mlx5_9:1,mlx5_0:1"}).usable);
  EXPECT_TRUE(rdma_report(kConnectX, {}, {Transport::kRdma, RdmaTransport::kRc, "all"}).usable);
  // A NIC, but no RDMA connection manager (rdma_ucm not loaded): rdma connects through it.
  r = rdma_report(kConnectX, kConnectXPorts, {Transport::kRdma, RdmaTransport::kRc}, /*rdma_cm=*/false);
  EXPECT_FALSE(r.usable);
  EXPECT_EQ(r.why.rfind("no RDMA connection manager (/dev/infiniband/rdma_cm: load the rdma_ucm module)", 0), 0u)
      << r.why;
}

// What UCX pins per worker (its receive queues and send buffers) counts against the limit too: only
// where memory is pinned at all.
TEST(Transports, AWorkerPinsUcxsOwnBuffers) {
  for (RdmaTransport kind : {RdmaTransport::kRc, RdmaTransport::kDc, RdmaTransport::kUd}) {
    EXPECT_EQ(worker_pinned_bytes({Transport::kRdma, kind}), uint64_t(64) << 20);
  }
  EXPECT_EQ(worker_pinned_bytes({Transport::kShm}), 0u);
  EXPECT_EQ(worker_pinned_bytes({Transport::kTcp}), 0u);
}

TEST(Transports, LockedMemoryMustCoverWhatTheNicPins) {
  EXPECT_EQ(memlock_shortfall(64 << 20, false, 32 << 20, "the blocks"), std::nullopt);
  EXPECT_EQ(memlock_shortfall(UINT64_MAX, false, uint64_t(1) << 40, "the blocks"), std::nullopt);
  EXPECT_EQ(memlock_shortfall(8 << 20, true, 32 << 20, "the blocks"), std::nullopt) << "CAP_IPC_LOCK locks any amount";
  auto why = memlock_shortfall(8 << 20, false, 32 << 20, "the send blocks");
  ASSERT_TRUE(why);
  EXPECT_EQ(why->rfind(
                "the locked-memory limit (ulimit -l) is 8.0 MiB, but the NIC must pin 32.0 MiB for the send blocks", 0),
            0u)
      << *why;
  EXPECT_NE(why->find("ulimit -l unlimited"), std::string::npos);
  // Only transports that pin memory are checked: shm and tcp need no limit at all.
  EXPECT_TRUE(check_memlock({Transport::kShm}, uint64_t(1) << 50, "x").is_ok());
  EXPECT_TRUE(check_memlock({Transport::kTcp}, uint64_t(1) << 50, "x").is_ok());
}

TEST(Transports, ThisProcesssLockedMemoryLimitIsTheOneChecked) {
  // A child that lowers its limit to 64 KiB and gives up root (and with it CAP_IPC_LOCK) must be
  // told, naming its limit; the rdma check reads the process's own limit and capabilities.
  if (geteuid() != 0) GTEST_SKIP() << "needs root to become another user";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    rlimit rl{64 << 10, 64 << 10};
    if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0 || setresgid(65534, 65534, 65534) != 0 ||
        setresuid(65534, 65534, 65534) != 0) {
      _exit(3);
    }
    Status st = check_memlock({Transport::kRdma}, 32 << 20, "the blocks");
    const bool named = st.message().find("is 64.0 KiB, but the NIC must pin 32.0 MiB") != std::string::npos;
    const bool shm_ok = check_memlock({Transport::kShm}, 32 << 20, "the blocks").is_ok();
    _exit(st.code() == Code::kInvalidArgument && named && shm_ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: not refused or the limit not named; 3: could not set the child up";
}

}  // namespace
}  // namespace slotstream::fabric
