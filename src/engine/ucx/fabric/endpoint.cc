// The fabric's operations: Request (a UCX operation in flight, or one the fabric carries itself), Endpoint
// (connect, close, put, get, tag send, the lanes UCX chose) and TagReceive.
#include "engine/ucx/fabric/fabric.h"

#include "common.h"
#include "engine/ucx/fabric/cm.h"
#include "engine/ucx/fabric/internal.h"
#include "engine/ucx/fabric/shm_dir.h"
#include "engine/ucx/fabric/soft_rma.h"

#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <thread>

#include <spdlog/spdlog.h>

namespace slotstream::fabric {

namespace {
using internal::from_ucs;
using internal::g_counters;
using internal::op_finished;
using internal::op_started;
using internal::track;

using Clock = std::chrono::steady_clock;

// How long closing an endpoint (or the endpoints a listener accepted) may progress the worker
// until UCX is done with it: closes end in microseconds; a Soft-RoCE VM takes longer.
constexpr std::chrono::seconds kCloseTimeout{10};

template <typename Word>
void store_word_release(std::byte* dst, const void* src) {
  Word w;
  std::memcpy(&w, src, sizeof w);
  std::atomic_ref<Word>(*reinterpret_cast<Word*>(dst)).store(w, std::memory_order_release);
}

// A flag word (1, 2, 4 or 8 bytes, naturally aligned: put_flagged checked) stored into a mapped
// peer region with release: everything this thread wrote before it is seen by whoever sees it.
void store_release(std::byte* dst, const void* src, size_t length) {
  switch (length) {
    case 1:
      return store_word_release<uint8_t>(dst, src);
    case 2:
      return store_word_release<uint16_t>(dst, src);
    case 4:
      return store_word_release<uint32_t>(dst, src);
    default:
      return store_word_release<uint64_t>(dst, src);
  }
}

}  // namespace

// ---------------------------------------------------------------------------------- Request
Request::Request(std::shared_ptr<SoftOp> op) : op_(std::move(op)) { op_started(); }

Request::~Request() { release(); }

// Abandoning a running request: UCX frees it when it completes; a fabric-carried one is
// forgotten (a late reply is dropped).
void Request::release() {
  if (req_ != nullptr) {
    // A get still running would write its destination later: end it first (class comment).
    if (get_of_ != nullptr && ucp_request_check_status(req_) == UCS_INPROGRESS) get_of_->abandon(req_);
    ucp_request_free(req_);
    req_ = nullptr;
    get_of_ = nullptr;
    op_finished();
  }
  if (op_ != nullptr) {
    if (op_->state.load(std::memory_order_acquire) == SoftOp::kPending) op_->owner->forget(op_.get());
    op_.reset();
    op_finished();
  }
}

Request& Request::operator=(Request&& other) noexcept {
  if (this != &other) {
    release();
    req_ = other.req_;
    get_of_ = other.get_of_;
    op_ = std::move(other.op_);
    other.req_ = nullptr;
  }
  return *this;
}

Status Request::check() {
  if (op_ != nullptr) {
    const int state = op_->owner->check(*op_);
    if (state == SoftOp::kPending) return {Code::kInProgress, "request"};
    Status st = state == SoftOp::kDone ? Status::ok() : op_->error;
    op_.reset();
    op_finished();
    g_counters.completions.fetch_add(1, std::memory_order_relaxed);
    return st;
  }
  if (req_ == nullptr) return Status::ok();
  ucs_status_t st = ucp_request_check_status(req_);
  if (st == UCS_INPROGRESS) return {Code::kInProgress, "request"};
  ucp_request_free(req_);
  req_ = nullptr;
  get_of_ = nullptr;
  op_finished();
  g_counters.completions.fetch_add(1, std::memory_order_relaxed);
  return from_ucs(st, "operation failed");
}

Status Request::wait(Worker& worker, const Liveness& alive) {
  // Spin first, for a bounded time, when operations on this worker normally complete within
  // microseconds (shm, rdma); where they take a round trip through the peer's progress thread (a
  // status read over tcp: ~25-100 µs), sleep in the worker's event wait at once (wait_policy).
  // Then sleep up to 1 ms at a time, and up to 8 ms once the wait has lasted 100 ms: the answer that
  // completes the operation ends the sleep (the worker's event wait), and a stalled or stopped peer
  // costs no core. The spin is bounded in time because the answer may need the core this thread
  // spins on: the receiver's progress thread waits for one on a busy host.
  // (Spinning 2,048 progress calls, ~0.9 ms over tcp, then sleeping blind, put a millisecond into
  // 1 % of the one-message latencies on two cores; spinning 100 µs per status read over tcp made
  // status_byte's sender cost more CPU per MB than the sliding window's, docs/benchmarks.md.)
  using Clock = std::chrono::steady_clock;
  constexpr auto kMaxSleep = std::chrono::microseconds(1000);
  constexpr auto kLongWait = std::chrono::milliseconds(100);
  constexpr auto kMaxLongSleep = std::chrono::microseconds(8000);
  Status st = check();
  if (st.code() != Code::kInProgress) return st;
  const auto start = Clock::now();
  const auto spin_until = start + wait_policy::spin_budget(worker.typical_completion());
  const auto read_timeout =
      worker.read_timeout().count() > 0 && is_read() ? worker.read_timeout() : std::chrono::milliseconds(0);
  auto next_check = start;
  auto sleep = std::chrono::microseconds(10);
  bool spinning = true;
  for (unsigned spins = 0;; ++spins) {
    const bool progressed = worker.progress() != 0;
    st = check();
    if (st.code() != Code::kInProgress) {
      worker.note_completion(Clock::now() - start);
      return st;
    }
    if (spinning && ((spins & 15) == 0)) spinning = Clock::now() < spin_until;
    const bool sleeping = !spinning && !progressed;
    if (sleeping) {
      worker.wait_or_sleep(sleep);
      sleep = std::min(Clock::now() - start < kLongWait ? kMaxSleep : kMaxLongSleep, sleep * 2);
    }
    // Spinning, the clock is read every 256 turns; sleeping, every turn: 256 sleeps of "1 ms" are
    // 0.3 s on an idle host and seconds on a loaded one, late for a stall timeout.
    if (!sleeping && (spins & 255) != 0) continue;
    const auto now = Clock::now();
    if (read_timeout.count() > 0 && now - start >= read_timeout) return lost(now - start);
    if (alive && now >= next_check) {
      SLOTSTREAM_RETURN_IF_ERROR(alive());
      next_check = Clock::now() + std::chrono::milliseconds(1);
    }
  }
}

bool Request::is_read() const {
  return get_of_ != nullptr || (op_ != nullptr && op_->dst != nullptr);  // a soft get has a destination
}

// The peer is alive (the caller's liveness says so) and a read has not been answered for the worker's
// read timeout: the transport lost it. The request stays pending; dropping it ends it (release()).
Status Request::lost(std::chrono::steady_clock::duration waited) const {
  char text[320];
  std::snprintf(text, sizeof text,
                "the transport has not answered a read of the peer's memory in %.1f s while the peer is alive: "
                "it was lost on the way (a NIC or driver that dropped a response?)",
                std::chrono::duration<double>(waited).count());
  return {Code::kTransportError, text};
}

namespace internal {
Status track(ucs_status_ptr_t ptr, const char* what, Request* req, Endpoint* get_of) {
  if (ptr == nullptr) return Status::ok();
  if (UCS_PTR_IS_ERR(ptr)) return from_ucs(UCS_PTR_STATUS(ptr), what);
  op_started();
  *req = Request(ptr, get_of);
  return Status::ok();
}
}  // namespace internal

// --------------------------------------------------------------------------------- Endpoint
void Endpoint::on_error(void* arg, ucp_ep* /*ep*/, int status) {
  auto* self = static_cast<Endpoint*>(arg);
  const auto st = static_cast<ucs_status_t>(status);
  if (self->state_.load(std::memory_order_relaxed) == State::kFailed) return;  // reported once
  self->failure_ = from_ucs(st, "peer unreachable");
  self->state_.store(State::kFailed, std::memory_order_release);
  if (self->worker_.soft_) self->worker_.soft_->fail_endpoint(self, self->failure_);
  // A peer that went away is expected (timeouts, resets); anything else is worth a look.
  if (self->failure_.code() == Code::kPeerGone) {
    spdlog::debug("endpoint error: {}", ucs_status_string(st));
  } else {
    spdlog::warn("fabric: unexpected endpoint error from UCX: {}", ucs_status_string(st));
  }
}

Status Endpoint::create(Worker& worker, std::span<const uint8_t> remote_address, const std::string& peer_host,
                        std::unique_ptr<Endpoint>* out, const Liveness& alive) {
  std::unique_ptr<Endpoint> ep(new Endpoint(worker));
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  // Peer-failure handling makes UCX drop shared-memory transports for RMA (they have no peer
  // failure handler), so on shm we go without; a dead receiver is noticed through the control
  // socket instead (see Liveness). On tcp and rdma (rc, dc and ud handle it natively) it turns a
  // dead peer into an endpoint error.
  params.err_mode = worker.context().traits().peer_errors ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
  params.err_handler.cb = [](void* arg, ucp_ep_h e, ucs_status_t st) { on_error(arg, e, st); };
  params.err_handler.arg = ep.get();
  if (auto address = decode_cm_address(remote_address)) {
    const bool rdma = worker.context().transport() == Transport::kRdma;
    const CmConnect how{.loopback = !rdma};
    // Operations issued while UCX still connects are queued and replayed, and UCX 1.13 does not
    // keep their order against operations issued during the replay (a status read overtook the
    // puts before it: duplicates and gaps). So nothing is issued before the connection stands:
    // a flush completes once it does. The peer's worker must be progressed meanwhile.
    const auto deadline = Clock::now() + kConnectTimeout;
    Status st;
    for (int attempt = 1;; ++attempt) {
      SLOTSTREAM_RETURN_IF_ERROR(cm_connect(worker.handle(), peer_host, address->ports, how, params, &ep->handle_));
      test_stop_point("wireup");
      bool alive_failed = false;
      st = ep->flush([&]() -> Status {
        if (ep->failed()) return ep->failure();
        if (alive) {
          Status a = alive();
          alive_failed = !a.is_ok();
          SLOTSTREAM_RETURN_IF_ERROR(a);
        }
        if (Clock::now() < deadline) return Status::ok();
        return {Code::kConnectFailed, "the peer's worker did not accept the connection within " +
                                          std::to_string(kConnectTimeout.count()) + " s"};
      });
      // The connection manager's own connection failed (UCX: ECONNREFUSED is "Endpoint is not
      // connected"), its peer's process still alive by the control connection: seen once in a few
      // thousand connections over tcp on a loaded host. Nothing was sent on the endpoint yet, so a
      // new one is as good; the listener closes its half of the failed one (CmListener).
      if (st.is_ok() || alive_failed || !ep->failed() || attempt >= kConnectAttempts || Clock::now() >= deadline) break;
      spdlog::info("fabric: connecting to {} failed ({}); trying again ({} of {})", peer_host, st.message(),
                   attempt + 1, kConnectAttempts);
      ep->close_handle(std::chrono::milliseconds(500));
      ep->failure_ = {};
      ep->state_.store(State::kOpen, std::memory_order_release);
      std::this_thread::sleep_for(std::chrono::milliseconds(50 * attempt));
    }
    if (!st.is_ok()) return {st.code(), "connecting to " + peer_host + ": " + st.message()};
    if (rdma) {
      ep->describe_lanes();
      // A flush of a connected rc endpoint proves the connection; of dc's (not connected) it
      // returns at once. A 1-byte read of the peer's memory needs the NIC to reach it either way.
      if (!address->probe_rkey.empty()) {
        st = ep->probe(address->probe_address, address->probe_rkey, kReachTimeout, alive);
        if (!st.is_ok()) return {st.code(), "reaching " + peer_host + "'s memory: " + st.message()};
      }
    }
  } else {
    params.field_mask |= UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    params.address = reinterpret_cast<const ucp_address_t*>(remote_address.data());
    SLOTSTREAM_RETURN_IF_ERROR(from_ucs(ucp_ep_create(worker.handle(), &params, &ep->handle_), "ucp_ep_create"));
  }
  g_counters.endpoints.fetch_add(1, std::memory_order_relaxed);
  *out = std::move(ep);
  return Status::ok();
}

Endpoint::~Endpoint() {
  if (handle_ == nullptr) return;
  if (worker_.soft_) worker_.soft_->fail_endpoint(this, {Code::kCancelled, "endpoint closed"});
  close_handle(kCloseTimeout);
}

void Endpoint::close_handle(std::chrono::milliseconds timeout) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t req = ucp_ep_close_nbx(std::exchange(handle_, nullptr), &param);
  if (req == nullptr || !UCS_PTR_IS_PTR(req)) return;
  // Until UCX is done with the endpoint: every operation on it has ended (cancelled), and with it
  // the queue pairs. A fixed number of progress calls was too few under emulation (Soft-RoCE VM).
  for (const auto until = Clock::now() + timeout; ucp_request_check_status(req) == UCS_INPROGRESS;) {
    worker_.progress_setup();
    if (Clock::now() >= until) {
      spdlog::warn("fabric: closing an endpoint took longer than {} ms; left to its worker",
                   std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count());
      break;
    }
  }
  ucp_request_free(req);
}

void Endpoint::abandon(void* req) {
  if (handle_ != nullptr && worker_.context().traits().peer_errors) {
    if (state_.load(std::memory_order_relaxed) != State::kFailed) {
      failure_ = {Code::kCancelled, "a read of this endpoint was abandoned (the endpoint was closed to end it)"};
      state_.store(State::kFailed, std::memory_order_release);
    }
    close_handle(kCloseTimeout);
  }
  for (const auto until = Clock::now() + kCloseTimeout; ucp_request_check_status(req) == UCS_INPROGRESS;) {
    worker_.progress_setup();
    if (Clock::now() >= until) {
      spdlog::error("fabric: a read abandoned at shutdown has not ended after {} s", kCloseTimeout.count());
      break;
    }
  }
}

namespace {
// One lane of `ucp_ep_print_info`, as UCX 1.13 prints it (ucp_ep_config_lane_info_str):
//   "#   lane[0]:  1:rc_verbs/rxe0:1.0 md[1]    -> md[1]/ib/sysdev[255] rma_bw#0 am am_bw#0 keepalive"
// as "rc_verbs/rxe0:1" and what it carries ("rma am keepalive"); false for any other line.
bool parse_lane(const std::string& line, std::string* tl_dev, std::vector<std::string>* roles) {
  const size_t lane = line.find("lane[");
  if (lane == std::string::npos) return false;
  std::istringstream in(line.substr(line.find(':', lane) + 1));
  std::string resource, word;
  in >> resource;  // " 1:rc_verbs/rxe0:1.0"
  const size_t colon = resource.find(':'), dot = resource.rfind('.');
  if (colon == std::string::npos) return false;
  *tl_dev = resource.substr(colon + 1, dot == std::string::npos || dot < colon ? std::string::npos : dot - colon - 1);
  roles->clear();
  while (in >> word) {
    const std::string role = word.substr(0, word.find('#'));
    if (role == "rma_bw" || role == "amo" || role == "am" || role == "am_bw" || role == "keepalive" ||
        role.starts_with("wireup") || role == "tag_offload" || role == "rkey_ptr") {
      const std::string name = role == "rma_bw" ? "rma" : role == "am_bw" ? "am" : role.substr(0, role.find('{'));
      if (std::find(roles->begin(), roles->end(), name) == roles->end()) roles->push_back(name);
    }
  }
  return true;
}

// Transports whose RMA the hardware or the initiator's CPU carries (no answer from the peer's
// worker): RDMA NICs and shared memory.
bool one_sided_tl(const std::string& tl) {
  for (const char* p : {"rc_", "dc_", "posix", "sysv", "cma", "knem", "xpmem", "self"}) {
    if (tl.starts_with(p)) return true;
  }
  return false;
}
}  // namespace

void Endpoint::describe_lanes() {
  char* text = nullptr;
  size_t size = 0;
  FILE* f = open_memstream(&text, &size);
  if (f == nullptr) return;
  ucp_ep_print_info(handle_, f);
  std::fclose(f);
  std::istringstream in(std::string(text, size));
  std::free(text);
  std::vector<std::string> lanes;
  bool one_sided = false;
  for (std::string line; std::getline(in, line);) {
    std::string tl_dev;
    std::vector<std::string> roles;
    if (!parse_lane(line, &tl_dev, &roles)) continue;
    const bool rma = std::find(roles.begin(), roles.end(), "rma") != roles.end();
    one_sided = one_sided || (rma && one_sided_tl(tl_dev));
    lanes.push_back(tl_dev + (roles.empty() ? "" : " " + join(roles, " ")));
  }
  lanes_ = join(lanes, "; ");
  rma_one_sided_ = one_sided;
}

Status Endpoint::probe(uint64_t address, std::span<const uint8_t> packed_rkey, std::chrono::milliseconds timeout,
                       const Liveness& alive) {
  std::unique_ptr<RemoteKey> key;
  SLOTSTREAM_RETURN_IF_ERROR(RemoteKey::unpack(*this, packed_rkey, &key));
  uint8_t word = 0;  // a pending read of it ends before `req` goes (Request, abandon)
  Request req;
  SLOTSTREAM_RETURN_IF_ERROR(get(&word, 1, address, *key, &req));
  const auto until = Clock::now() + timeout;
  return req.wait(worker_, [&]() -> Status {
    if (failed()) return failure();
    if (alive) SLOTSTREAM_RETURN_IF_ERROR(alive());
    if (Clock::now() < until) return Status::ok();
    return {Code::kTimeout, "the NIC did not answer a 1-byte read of the peer's memory within " +
                                std::to_string(std::chrono::duration_cast<std::chrono::seconds>(timeout).count()) +
                                " s"};
  });
}

Status Endpoint::flush(const Liveness& alive) {
  if (handle_ == nullptr) return failure_;
  ucp_request_param_t param{};
  Request req;
  SLOTSTREAM_RETURN_IF_ERROR(track(ucp_ep_flush_nbx(handle_, &param), "ucp_ep_flush_nbx", &req));
  SLOTSTREAM_RETURN_IF_ERROR(req.wait(worker_, alive));
  // Our own puts are complete once the peer has answered a flush request sent behind them.
  if (worker_.soft_) return worker_.soft_->flush(*this, alive);
  return Status::ok();
}

Status Endpoint::put(const void* src, size_t length, uint64_t remote_addr, RemoteKey& rkey, Request* req) {
  if (failed()) return failure_;
  ucp_request_param_t param{};
  g_counters.puts.fetch_add(1, std::memory_order_relaxed);
  if (worker_.soft_) return worker_.soft_->put(*this, src, length, remote_addr, req);
  if (std::byte* dst = rkey.local(remote_addr)) {
    std::memcpy(dst, src, length);
    return Status::ok();
  }
  return track(ucp_put_nbx(handle_, src, length, remote_addr, rkey.handle(), &param), "ucp_put_nbx", req);
}

Status Endpoint::put_flagged(const void* src, size_t length, uint64_t remote_addr, const void* flag, size_t flag_length,
                             uint64_t flag_addr, RemoteKey& rkey, Request* req) {
  if (failed()) return failure_;
  if (flag_length == 0 || flag_length > sizeof(uint64_t) || !std::has_single_bit(flag_length) ||
      flag_addr % flag_length != 0) {
    return {Code::kInvalidArgument, "a flag is a naturally aligned word of 1, 2, 4 or 8 bytes"};
  }
  if (worker_.soft_) {
    g_counters.puts.fetch_add(2, std::memory_order_relaxed);
    return worker_.soft_->put_flagged(*this, src, length, remote_addr, flag, flag_length, flag_addr, req);
  }
  if (std::byte* flag_dst = rkey.local(flag_addr)) {
    // Mapped: the data, then the flag with a release store, so that a peer that loads the flag
    // with acquire (or after its own fence) sees the data.
    g_counters.puts.fetch_add(2, std::memory_order_relaxed);
    std::memcpy(rkey.local(remote_addr), src, length);
    store_release(flag_dst, flag, flag_length);
    return Status::ok();
  }
  SLOTSTREAM_RETURN_IF_ERROR(put(src, length, remote_addr, rkey, req));
  SLOTSTREAM_RETURN_IF_ERROR(worker_.fence());
  Request flag_req;  // fire and forget: errors surface at the next flush or read
  return put(flag, flag_length, flag_addr, rkey, &flag_req);
}

Status Endpoint::get(void* dst, size_t length, uint64_t remote_addr, RemoteKey& rkey, Request* req) {
  if (failed()) return failure_;
  ucp_request_param_t param{};
  g_counters.gets.fetch_add(1, std::memory_order_relaxed);
  if (worker_.soft_) return worker_.soft_->get(*this, dst, length, remote_addr, req);
  if (const std::byte* src = rkey.local(remote_addr)) {
    std::memcpy(dst, src, length);
    // What was read (a status byte, a ring's tail) is acted on as a peer's release of memory.
    std::atomic_thread_fence(std::memory_order_acquire);
    return Status::ok();
  }
  return track(ucp_get_nbx(handle_, dst, length, remote_addr, rkey.handle(), &param), "ucp_get_nbx", req, this);
}

Status Endpoint::am_send(unsigned id, const void* header, size_t header_len, const void* data, size_t data_len,
                         bool want_reply, Request* req) {
  if (failed()) return failure_;
  ucp_request_param_t param{};
  if (want_reply) {
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_AM_SEND_FLAG_REPLY;
  }
  g_counters.am_sends.fetch_add(1, std::memory_order_relaxed);
  return track(ucp_am_send_nbx(handle_, id, header, header_len, data, data_len, &param), "ucp_am_send_nbx", req);
}

Status Endpoint::tag_send(const void* src, size_t length, uint64_t tag, Request* req) {
  if (failed()) return failure_;
  ucp_request_param_t param{};
  g_counters.tag_sends.fetch_add(1, std::memory_order_relaxed);
  return track(ucp_tag_send_nbx(handle_, src, length, tag, &param), "ucp_tag_send_nbx", req);
}

// ------------------------------------------------------------------------------- TagReceive
TagReceive::~TagReceive() { reset(); }

void TagReceive::reset() {
  unexpected_ = false;
  if (req_ == nullptr) return;
  // Still posted: withdraw it so UCX never writes into memory its owner is about to free. (A
  // receive already being filled completes on its own; the owner must have waited for that.)
  ucp_request_cancel(worker_, req_);
  ucp_request_free(req_);
  req_ = nullptr;
  op_finished();
}

TagReceive::TagReceive(TagReceive&& other) noexcept
    : req_(other.req_),
      worker_(other.worker_),
      unexpected_(other.unexpected_) {
  other.req_ = nullptr;
  other.unexpected_ = false;
}

TagReceive& TagReceive::operator=(TagReceive&& other) noexcept {
  if (this != &other) {
    reset();
    req_ = other.req_;
    worker_ = other.worker_;
    unexpected_ = other.unexpected_;
    other.req_ = nullptr;
    other.unexpected_ = false;
  }
  return *this;
}

Status TagReceive::check(size_t* length) {
  if (req_ == nullptr) return {Code::kInvalidArgument, "no receive posted"};
  ucp_tag_recv_info_t info{};
  ucs_status_t st = ucp_tag_recv_request_test(req_, &info);
  if (st == UCS_INPROGRESS) return {Code::kInProgress, "tag receive"};
  // The request was completed by whichever thread progressed the worker: order our reads of
  // the buffer after its writes.
  std::atomic_thread_fence(std::memory_order_acquire);
  ucp_request_free(req_);
  req_ = nullptr;
  op_finished();
  g_counters.completions.fetch_add(1, std::memory_order_relaxed);
  if (st != UCS_OK) return from_ucs(st, "tag receive");
  *length = info.length;
  return Status::ok();
}

void TagReceive::cancel() {
  if (req_ != nullptr) ucp_request_cancel(worker_, req_);
}

}  // namespace slotstream::fabric
