// Endpoints over tcp and rdma are connected through UCX's connection manager (a listener per
// worker, a client endpoint to HOST:PORT) rather than by worker address: tcp's manager over tcp
// sockets, rdma's over the RDMA connection manager (rdmacm).
//
// Why: UCX 1.13 wires an endpoint made from a worker address with messages of its own — the
// initiator's REQUEST, the target's REPLY — and over tcp it queues them on the raw tcp endpoint
// until that endpoint's connection is acknowledged. If the peer dies before that, UCX purges the
// queue and asserts (ucp_request.c:684 "got REP message"; upstream dropped the assertion in
// 1.14): a sender killed within the first milliseconds of its connection takes the whole receiver
// down with SIGABRT (measured without the connection manager: 8 of 100 kills of sliding_window
// senders, 4 of 100 of status_byte senders; docs/hardening.md). The connection manager exchanges addresses inside its
// own connection (UCX_CM_USE_ALL_DEVICES=n: data lanes on the device the connection came over), so no wire-up message
// is ever queued, and a peer may die at any moment.
//
// rdma: the same request and reply, sent over the ud ":aux" lane, meet the same assertion when
// the endpoint is closed with the REQUEST still queued — a sender whose receiver does not answer
// (or dies) during wire-up aborts with SIGABRT — and on NICs other than ConnectX the ud lane drops
// every reply anyway (transports.h, UD_ETH_DGID_CHECK). Through rdmacm the
// rc (or dc) queue pairs are connected by the connection manager's own exchange, and nothing is
// queued on a lane that may never connect.
//
// A worker's address (Worker::address) is then the port of its listener: the peer connects to it
// at the host its control connection reached (Endpoint::create's peer_host). An rdma worker's
// address also carries a word of its memory that a peer reads with a timed 1-byte get to prove
// that the NIC reaches it (Endpoint::create: a flush proves nothing on dc, whose endpoints are not
// connected).
// Endpoints the listener accepts belong to the worker. One whose peer left stays open (failed:
// sending on it returns an error) for kFailedLinger and is closed after that, or with the worker:
// a protocol may still answer on it (a ReplyEp kept from a notification, sliding_window's and the
// rings' ACKs) until its session has noticed the loss, and a closed endpoint is freed memory.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/ucx/fabric/internal.h"

namespace slotstream::fabric {

// A worker's listeners as its address, little-endian:
//   magic "SLCM" | u16 IPv4 port | u16 IPv6 port (0: none)                       (tcp: 8 bytes)
//   ... | u64 probe address | u16 key length | packed remote key                   (rdma)
// (UCX 1.13's IPv6 listener does not take IPv4 peers, hence one of each.) A decoder takes both
// forms by their length; anything else is not a listener's address.
struct CmPorts {
  uint16_t v4 = 0;
  uint16_t v6 = 0;
};
struct CmAddress {
  CmPorts ports;
  // A word of the worker's memory a peer may read (Endpoint::create's reachability probe), and its
  // packed remote key; 0 and empty: none.
  uint64_t probe_address = 0;
  std::vector<uint8_t> probe_rkey;
};
std::vector<uint8_t> encode_cm_address(const CmAddress& address);
inline std::vector<uint8_t> encode_cm_address(CmPorts ports) { return encode_cm_address(CmAddress{ports}); }
// The listener's address, if `address` is one (not a UCX worker address).
std::optional<CmAddress> decode_cm_address(std::span<const uint8_t> address);

// How an endpoint reaches its peer's listener (cm_connect).
struct CmConnect {
  // tcp: a peer on this host is reached over loopback (see cm.cc). rdma: never — rdmacm has no
  // loopback device; a loopback `host` becomes an address of this host's RDMA port instead.
  bool loopback = true;
};

// Connects `worker` to the listener at `host` (its port for the host's address family) through
// the connection manager; `params` carries the error handler already.
Status cm_connect(ucp_worker_h worker, const std::string& host, CmPorts ports, const CmConnect& how,
                  ucp_ep_params_t params, ucp_ep_h* out);

// An IPv4 address of an RDMA port of this host (from its RoCE GIDs, /sys/class/infiniband), or
// empty: where rdmacm connects to a peer on this host that was reached over loopback.
std::string local_rdma_address();

// Tests only: this process's listeners reject the next `n` connection requests (a connection the
// manager failed; Endpoint::create connects again).
void reject_next_connections_for_test(int n);

// Threading: created and destroyed with its worker; its handlers run on whichever thread
// progresses the worker, reap() too (Worker::progress).
class CmListener {
 public:
  static Status create(ucp_worker_h worker, std::unique_ptr<CmListener>* out);
  // Stops listening and closes every endpoint it accepted (progressing the worker).
  ~CmListener();
  CmListener(const CmListener&) = delete;
  CmListener& operator=(const CmListener&) = delete;

  CmPorts ports() const { return ports_; }
  // Closes accepted endpoints whose peer left kFailedLinger ago or more (cheap when none did).
  void reap();

  // Far longer than a session takes to notice its sender is gone and end (the control socket's EOF,
  // or its keepalive: net::kPeerTimeout, 11 s).
  static constexpr std::chrono::seconds kFailedLinger{60};

 private:
  explicit CmListener(ucp_worker_h worker) : worker_(worker) {}
  // Listens on every address of `family` (AF_INET, AF_INET6), an ephemeral port; returns the port.
  Status listen(int family, uint16_t* port);
  static void on_request(ucp_conn_request_h request, void* arg);
  static void on_error(void* arg, ucp_ep_h ep, ucs_status_t status);

  ucp_worker_h worker_;
  std::vector<ucp_listener_h> listeners_;
  CmPorts ports_;
  std::mutex mutex_;  // guards the lists (a shared worker's handlers and reap may race)
  std::vector<ucp_ep_h> accepted_;
  using Clock = std::chrono::steady_clock;
  std::vector<std::pair<ucp_ep_h, Clock::time_point>> failed_;  // accepted, peer left (when), to close
  std::vector<void*> closing_;                                  // their close requests
  std::atomic<bool> any_failed_{false};
  std::atomic<Clock::rep> next_due_{0};  // when reap() next has something to close
};

}  // namespace slotstream::fabric
