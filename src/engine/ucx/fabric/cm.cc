#include "engine/ucx/fabric/cm.h"

#include "engine/ucx/fabric/fabric.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <spdlog/spdlog.h>

namespace slotstream::fabric {
namespace {

constexpr uint8_t kCmMagic[4] = {'S', 'L', 'C', 'M'};

// Force-closes `ep`; returns its close request (nullptr when done at once).
void* close_ep(ucp_ep_h ep) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t req = ucp_ep_close_nbx(ep, &param);
  return UCS_PTR_IS_PTR(req) ? req : nullptr;
}

// Frees the close requests that completed; keeps the others.
void reap_closing(std::vector<void*>* closing) {
  std::erase_if(*closing, [](void* req) {
    if (ucp_request_check_status(req) == UCS_INPROGRESS) return false;
    ucp_request_free(req);
    return true;
  });
}

// Whether `ss` (an IPv4 or IPv6 address, port ignored) is an address of an interface of this host.
bool is_local_address(const sockaddr_storage& ss) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return false;
  bool local = false;
  for (ifaddrs* i = list; i != nullptr && !local; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != ss.ss_family) continue;
    if (ss.ss_family == AF_INET) {
      local = reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr ==
              reinterpret_cast<const sockaddr_in&>(ss).sin_addr.s_addr;
    } else {
      local = std::memcmp(&reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr,
                          &reinterpret_cast<const sockaddr_in6&>(ss).sin6_addr, sizeof(in6_addr)) == 0;
    }
  }
  freeifaddrs(list);
  return local;
}

// A peer on this very host is reached over loopback. UCX puts an endpoint's data on the device its
// connection came over, found by the connection's local address; one of a device that is down (an
// address the control connection still reached through the kernel's local routes) has no UCX
// interface, and the connection would fail as unreachable.
void prefer_loopback(sockaddr_storage* ss) {
  if (!is_local_address(*ss)) return;
  if (ss->ss_family == AF_INET) {
    reinterpret_cast<sockaddr_in*>(ss)->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  } else {
    reinterpret_cast<sockaddr_in6*>(ss)->sin6_addr = in6addr_loopback;
  }
}

}  // namespace

namespace {
void put_le(std::vector<uint8_t>* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<uint8_t>(value >> (8 * i)));
}
uint64_t get_le(std::span<const uint8_t> in, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t(in[at + i]) << (8 * i);
  return v;
}
constexpr size_t kPortsSize = sizeof kCmMagic + 4;  // magic, two ports
constexpr size_t kRdmaFixed = kPortsSize + 8 + 2;   // ... probe address, key length
}  // namespace

std::vector<uint8_t> encode_cm_address(const CmAddress& address) {
  std::vector<uint8_t> out(std::begin(kCmMagic), std::end(kCmMagic));
  put_le(&out, address.ports.v4, 2);
  put_le(&out, address.ports.v6, 2);
  if (address.probe_rkey.empty()) return out;
  put_le(&out, address.probe_address, 8);
  put_le(&out, address.probe_rkey.size(), 2);
  out.insert(out.end(), address.probe_rkey.begin(), address.probe_rkey.end());
  return out;
}

std::optional<CmAddress> decode_cm_address(std::span<const uint8_t> address) {
  if (address.size() < kPortsSize || !std::equal(std::begin(kCmMagic), std::end(kCmMagic), address.begin())) {
    return std::nullopt;
  }
  CmAddress out;
  out.ports = {static_cast<uint16_t>(get_le(address, 4, 2)), static_cast<uint16_t>(get_le(address, 6, 2))};
  if (address.size() == kPortsSize) return out;
  if (address.size() < kRdmaFixed) return std::nullopt;
  const size_t key_length = get_le(address, kPortsSize + 8, 2);
  if (address.size() != kRdmaFixed + key_length || key_length == 0) return std::nullopt;
  out.probe_address = get_le(address, kPortsSize, 8);
  out.probe_rkey.assign(address.begin() + kRdmaFixed, address.end());
  return out;
}

std::string local_rdma_address() {
  // A RoCE port's GIDs hold its netdev's IP addresses; an IPv4 one reads ::ffff:a.b.c.d
  // (0000:...:ffff:0a09:0001). The first of any port (sorted, so that it is always the same one).
  namespace fs = std::filesystem;
  std::vector<fs::path> gids;
  std::error_code ec;
  for (const auto& dev : fs::directory_iterator("/sys/class/infiniband", ec)) {
    std::error_code ec2;
    for (const auto& port : fs::directory_iterator(dev.path() / "ports", ec2)) {
      std::error_code ec3;
      for (const auto& gid : fs::directory_iterator(port.path() / "gids", ec3)) gids.push_back(gid.path());
    }
  }
  std::sort(gids.begin(), gids.end());
  for (const fs::path& path : gids) {
    std::ifstream in(path);
    std::string gid;
    if (!std::getline(in, gid) || gid.size() != 39 || !gid.starts_with("0000:0000:0000:0000:0000:ffff:")) continue;
    const unsigned long hi = std::stoul(gid.substr(30, 4), nullptr, 16),
                        lo = std::stoul(gid.substr(35, 4), nullptr, 16);
    return std::to_string(hi >> 8) + "." + std::to_string(hi & 0xff) + "." + std::to_string(lo >> 8) + "." +
           std::to_string(lo & 0xff);
  }
  return "";
}

Status cm_connect(ucp_worker_h worker, const std::string& host_in, CmPorts ports, const CmConnect& how,
                  ucp_ep_params_t params, ucp_ep_h* out) {
  std::string host = host_in;
  if (!how.loopback && (host.starts_with("127.") || host == "::1" || host == "localhost")) {
    // Reached over loopback: this host. rdmacm finds a device by the address's route, and the
    // loopback interface has none: use the address of this host's RDMA port.
    if (std::string local = local_rdma_address(); !local.empty()) host = local;
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res); rc != 0) {
    return {Code::kConnectFailed, "cannot use the peer's address '" + host + "': " + gai_strerror(rc)};
  }
  sockaddr_storage ss{};
  std::memcpy(&ss, res->ai_addr, res->ai_addrlen);
  socklen_t len = res->ai_addrlen;
  freeaddrinfo(res);
  if (const auto& v6 = reinterpret_cast<const sockaddr_in6&>(ss);
      ss.ss_family == AF_INET6 && IN6_IS_ADDR_V4MAPPED(&v6.sin6_addr)) {
    // An IPv4 peer seen through a dual-stack socket (::ffff:a.b.c.d): it listens on IPv4.
    sockaddr_in v4{};
    v4.sin_family = AF_INET;
    std::memcpy(&v4.sin_addr, &v6.sin6_addr.s6_addr[12], sizeof v4.sin_addr);
    ss = {};
    std::memcpy(&ss, &v4, sizeof v4);
    len = sizeof v4;
  }
  if (how.loopback) prefer_loopback(&ss);
  const uint16_t port = ss.ss_family == AF_INET6 ? ports.v6 : ports.v4;
  if (port == 0) return {Code::kConnectFailed, "the peer does not listen on " + host + "'s address family"};
  if (ss.ss_family == AF_INET6) {
    reinterpret_cast<sockaddr_in6&>(ss).sin6_port = htons(port);
  } else {
    reinterpret_cast<sockaddr_in&>(ss).sin_port = htons(port);
  }
  params.field_mask |= UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
  params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&ss);
  params.sockaddr.addrlen = len;
  return internal::from_ucs(ucp_ep_create(worker, &params, out), "ucp_ep_create (connecting to the peer's listener)");
}

// Every address, an ephemeral port: like the tcp interfaces UCX itself opens on every device.
Status CmListener::listen(int family, uint16_t* port) {
  sockaddr_storage any{};
  any.ss_family = static_cast<sa_family_t>(family);
  if (family == AF_INET6) reinterpret_cast<sockaddr_in6&>(any).sin6_addr = in6addr_any;
  ucp_listener_params_t params{};
  params.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  params.conn_handler = {&CmListener::on_request, this};
  params.sockaddr = {reinterpret_cast<const sockaddr*>(&any),
                     static_cast<socklen_t>(family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in))};
  ucp_listener_h listener = nullptr;
  SLOTSTREAM_RETURN_IF_ERROR(
      internal::from_ucs(ucp_listener_create(worker_, &params, &listener), "ucp_listener_create"));
  listeners_.push_back(listener);
  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  SLOTSTREAM_RETURN_IF_ERROR(internal::from_ucs(ucp_listener_query(listener, &attr), "ucp_listener_query"));
  const auto& ss = attr.sockaddr;
  *port = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6&>(ss).sin6_port
                                         : reinterpret_cast<const sockaddr_in&>(ss).sin_port);
  return Status::ok();
}

Status CmListener::create(ucp_worker_h worker, std::unique_ptr<CmListener>* out) {
  std::unique_ptr<CmListener> self(new CmListener(worker));
  SLOTSTREAM_RETURN_IF_ERROR(self->listen(AF_INET, &self->ports_.v4));
  if (!self->listen(AF_INET6, &self->ports_.v6).is_ok()) self->ports_.v6 = 0;  // a host without IPv6
  *out = std::move(self);
  return Status::ok();
}

// UCX is never called with mutex_ held: UCX calls the handlers below with the worker's lock held,
// and they take mutex_ (the opposite order could deadlock two threads of a shared worker).
CmListener::~CmListener() {
  for (ucp_listener_h l : listeners_) ucp_listener_destroy(l);
  std::vector<ucp_ep_h> open;
  std::vector<void*> closing;
  {
    std::lock_guard lock(mutex_);
    open.swap(accepted_);
    for (const auto& f : failed_) open.push_back(f.first);
    failed_.clear();
    closing.swap(closing_);
  }
  for (ucp_ep_h ep : open) {
    if (void* req = close_ep(ep)) closing.push_back(req);
  }
  for (const auto until = Clock::now() + std::chrono::seconds(10); !closing.empty() && Clock::now() < until;) {
    ucp_worker_progress(worker_);
    reap_closing(&closing);
  }
  for (void* req : closing) ucp_request_free(req);  // UCX finishes them with the worker
}

namespace {
std::atomic<int> g_reject_next{0};
}  // namespace

void reject_next_connections_for_test(int n) { g_reject_next.store(n); }

// A peer connects: accept it. The endpoint serves the peer's puts, gets and messages; the
// protocols answer on the endpoint a message came from (ReplyEp), never on this one by name.
void CmListener::on_request(ucp_conn_request_h request, void* arg) {
  auto* self = static_cast<CmListener*>(arg);
  if (g_reject_next.load(std::memory_order_relaxed) > 0 && g_reject_next.fetch_sub(1) > 0) {
    ucp_listener_reject(self->listeners_.front(), request);
    return;
  }
  ucp_ep_params_t params{};
  params.field_mask =
      UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.conn_request = request;
  // The peer's client id (rdma: its worker's, CmListener::release), when it sent one.
  test_stop_point("accept");
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &CmListener::on_error;
  params.err_handler.arg = self;
  ucp_ep_h ep = nullptr;
  if (ucs_status_t st = ucp_ep_create(self->worker_, &params, &ep); st != UCS_OK) {
    spdlog::debug("fabric: could not accept a connection: {}", ucs_status_string(st));
    return;
  }
  std::lock_guard lock(self->mutex_);
  self->accepted_.push_back(ep);
}

// The peer left (or died): close its endpoint at the next reap (not inside UCX's callback).
void CmListener::on_error(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* self = static_cast<CmListener*>(arg);
  spdlog::debug("fabric: accepted endpoint ended: {}", ucs_status_string(status));
  std::lock_guard lock(self->mutex_);
  auto it = std::find(self->accepted_.begin(), self->accepted_.end(), ep);
  if (it == self->accepted_.end()) return;
  self->accepted_.erase(it);
  self->failed_.emplace_back(ep, Clock::now());
  self->any_failed_.store(true, std::memory_order_release);
}

void CmListener::reap() {
  if (!any_failed_.load(std::memory_order_acquire)) return;
  const auto now = Clock::now();
  if (now.time_since_epoch().count() < next_due_.load(std::memory_order_relaxed)) return;
  std::vector<ucp_ep_h> due;
  std::vector<void*> closing;
  {
    std::lock_guard lock(mutex_);
    std::erase_if(failed_, [&](const auto& f) {
      if (now - f.second < kFailedLinger) return false;
      due.push_back(f.first);
      return true;
    });
    closing.swap(closing_);
  }
  for (ucp_ep_h ep : due) {
    if (void* req = close_ep(ep)) closing.push_back(req);
  }
  reap_closing(&closing);
  std::lock_guard lock(mutex_);
  closing_.insert(closing_.end(), closing.begin(), closing.end());
  any_failed_.store(!closing_.empty() || !failed_.empty(), std::memory_order_release);
  // Look again when the oldest failed endpoint is due, or soon while closes are under way.
  auto next = now + (closing_.empty() ? kFailedLinger : std::chrono::milliseconds(10));
  for (const auto& f : failed_) next = std::min(next, f.second + kFailedLinger);
  next_due_.store(next.time_since_epoch().count(), std::memory_order_relaxed);
}

}  // namespace slotstream::fabric
