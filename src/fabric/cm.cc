#include "fabric/cm.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

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

std::vector<uint8_t> encode_cm_address(CmPorts ports) {
  std::vector<uint8_t> out(std::begin(kCmMagic), std::end(kCmMagic));
  for (uint16_t port : {ports.v4, ports.v6}) {
    out.push_back(static_cast<uint8_t>(port));
    out.push_back(static_cast<uint8_t>(port >> 8));
  }
  return out;
}

std::optional<CmPorts> decode_cm_address(std::span<const uint8_t> address) {
  if (address.size() != sizeof kCmMagic + 4 || !std::equal(std::begin(kCmMagic), std::end(kCmMagic), address.begin())) {
    return std::nullopt;
  }
  return CmPorts{static_cast<uint16_t>(address[4] | address[5] << 8),
                 static_cast<uint16_t>(address[6] | address[7] << 8)};
}

Status cm_connect(ucp_worker_h worker, const std::string& host, CmPorts ports, ucp_ep_params_t params, ucp_ep_h* out) {
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
  prefer_loopback(&ss);
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
  for (int i = 0; i < 100000 && !closing.empty(); ++i) {
    ucp_worker_progress(worker_);
    reap_closing(&closing);
  }
  for (void* req : closing) ucp_request_free(req);  // UCX finishes them with the worker
}

// A peer connects: accept it. The endpoint serves the peer's puts, gets and messages; the
// protocols answer on the endpoint a message came from (ReplyEp), never on this one by name.
void CmListener::on_request(ucp_conn_request_h request, void* arg) {
  auto* self = static_cast<CmListener*>(arg);
  ucp_ep_params_t params{};
  params.field_mask =
      UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.conn_request = request;
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
