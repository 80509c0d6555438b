#include "fabric/fabric.h"

#include "common.h"
#include "fabric/cm.h"
#include "fabric/internal.h"
#include "fabric/shm_dir.h"
#include "fabric/soft_rma.h"

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

Status internal::from_ucs(ucs_status_t st, const char* what) {
  if (st == UCS_OK) return Status::ok();
  if (st == UCS_INPROGRESS) return {Code::kInProgress, what};
  Code code = Code::kTransportError;
  switch (st) {
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_REJECTED:
      code = Code::kPeerGone;
      break;
    case UCS_ERR_CANCELED:
      code = Code::kCancelled;
      break;
    default:
      break;
  }
  return {code, std::string(what) + ": " + ucs_status_string(st)};
}

void test_stop_point(const char* point) {
  static const std::string wanted = [] {
    const char* env = getenv("SLOTSTREAM_TEST_STOP_AT");
    return env ? "," + std::string(env) + "," : std::string();
  }();
  if (wanted.empty() || wanted.find("," + std::string(point) + ",") == std::string::npos) return;
  const std::string line = "slotstream: stopped at " + std::string(point) + " (SLOTSTREAM_TEST_STOP_AT)\n";
  (void)!::write(2, line.data(), line.size());
  ::raise(SIGSTOP);
}

void UcxDestroy::operator()(ucp_context* h) const { ucp_cleanup(h); }
void UcxDestroy::operator()(ucp_worker* h) const { ucp_worker_destroy(h); }
void UcxDestroy::operator()(ucp_rkey* h) const { ucp_rkey_destroy(h); }

namespace {
using internal::from_ucs;

using Clock = std::chrono::steady_clock;

// How long closing an endpoint (or the endpoints a listener accepted) may progress the worker
// until UCX is done with it: closes end in microseconds; a Soft-RoCE VM takes longer.
constexpr std::chrono::seconds kCloseTimeout{10};

// Applies the fabric's UCX settings for `spec` (transports.h) to `config`; a user's UCX_* in the
// environment wins. ucp_config_modify takes a transport's setting without its prefix
// (UCX_TCP_TX_SEG_SIZE is "TX_SEG_SIZE"); in a tcp context only the tcp transport has those.
Status configure(ucp_config_t* config, const FabricSpec& spec, std::vector<std::string>* overrides) {
  // rdma asks for the rc transports this host has (transports.h): UCX's list, looked up once.
  const std::span<const std::string> host_tls = spec.transport == Transport::kRdma
                                                    ? std::span<const std::string>(host_ucx_transports())
                                                    : std::span<const std::string>();
  UcxChoice choice = ucx_settings(
      spec, [](const char* name) { return static_cast<const char*>(getenv(name)); }, host_tls);
  for (const UcxSetting& s : choice.apply) {
    SLOTSTREAM_RETURN_IF_ERROR(from_ucs(ucp_config_modify(config, s.key.c_str(), s.value.c_str()), s.env.c_str()));
  }
  *overrides = std::move(choice.overridden);
  return Status::ok();
}

struct AtomicCounters {
  std::atomic<uint64_t> endpoints{0}, registered_now{0}, registered_max{0}, puts{0}, gets{0}, am_sends{0},
      am_received{0}, tag_sends{0}, tag_receives{0}, tag_unexpected{0}, outstanding{0}, max_outstanding{0},
      completions{0}, progress_calls{0}, progress_useful{0}, progress_ns{0}, setup_progress_calls{0};
};
AtomicCounters g_counters;
// pinned_estimate(): rdma workers alive, bytes registered by contexts that pin (rdma).
std::atomic<uint64_t> g_pinned_workers{0}, g_pinned_regions{0};

void raise_max(std::atomic<uint64_t>& max, uint64_t value) {
  uint64_t seen = max.load(std::memory_order_relaxed);
  while (value > seen && !max.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

void op_started() { raise_max(g_counters.max_outstanding, g_counters.outstanding.fetch_add(1) + 1); }
void op_finished() { g_counters.outstanding.fetch_sub(1); }

}  // namespace

namespace internal {
void count_am_send() { g_counters.am_sends.fetch_add(1, std::memory_order_relaxed); }
void count_am_received() { g_counters.am_received.fetch_add(1, std::memory_order_relaxed); }
}  // namespace internal

Counters counters() {
  const auto& c = g_counters;
  Counters out;
  out.endpoints = c.endpoints.load();
  out.registered_bytes = c.registered_max.load();
  out.puts = c.puts.load();
  out.gets = c.gets.load();
  out.am_sends = c.am_sends.load();
  out.am_received = c.am_received.load();
  out.tag_sends = c.tag_sends.load();
  out.tag_receives = c.tag_receives.load();
  out.tag_unexpected = c.tag_unexpected.load();
  out.max_outstanding = c.max_outstanding.load();
  out.completions = c.completions.load();
  out.progress_calls = c.progress_calls.load();
  out.progress_useful = c.progress_useful.load();
  out.progress_ns = c.progress_ns.load();
  out.setup_progress_calls = c.setup_progress_calls.load();
  return out;
}

uint64_t pinned_estimate() {
  return g_pinned_regions.load() + g_pinned_workers.load() * worker_pinned_bytes({Transport::kRdma});
}

void reset_counters() {
  auto& c = g_counters;
  for (auto* a :
       {&c.endpoints, &c.puts, &c.gets, &c.am_sends, &c.am_received, &c.tag_sends, &c.tag_receives, &c.tag_unexpected,
        &c.completions, &c.progress_calls, &c.progress_useful, &c.progress_ns, &c.setup_progress_calls}) {
    a->store(0);
  }
  c.registered_max.store(c.registered_now.load());
  c.max_outstanding.store(c.outstanding.load());
}

// ---------------------------------------------------------------------------------- Context
Status Context::create(const FabricSpec& spec, std::unique_ptr<Context>* out) {
  if (spec.transport == Transport::kAuto)
    return {Code::kInvalidArgument, "a fabric context needs a transport, not auto"};
  // spdlog's registry is a function-local static of an uninstrumented library: build it here, before
  // the threads of this context's workers (progress, ACK threads) may log first at once — TSan cannot
  // see that static's guard and reported two ACK threads' first error logs as a race.
  (void)spdlog::default_logger_raw();
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return from_ucs(st, "ucp_config_read");
  std::vector<std::string> overrides;
  if (Status cs = configure(config, spec, &overrides); !cs.is_ok()) {
    ucp_config_release(config);
    return cs;
  }
  // POSIX shared-memory segments in a directory removed however this process ends (shm_dir.h).
  if (const std::string& dir = posix_segment_dir(); spec.transport == Transport::kShm && !dir.empty()) {
    ucp_config_modify(config, "DIR", dir.c_str());  // UCX_POSIX_DIR, without its transport's prefix
  }

  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  // TAG: the credit protocols' tagged send/receive (SDP §2: pre-posted receive buffers).
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 1;  // regions are mapped from set-up threads
  ucp_context_h handle = nullptr;
  st = ucp_init(&params, config, &handle);
  ucp_config_release(config);
  if (st != UCS_OK) return from_ucs(st, ("ucp_init (" + spec_name(spec) + ")").c_str());
  out->reset(new Context(handle, spec, std::move(overrides)));
  // Regions come from zero-filled allocators (transports.h, ALLOC_PRIO) unless a user chose others.
  (*out)->zero_filled_ = getenv("UCX_ALLOC_PRIO") == nullptr;
  return Status::ok();
}

Context::~Context() {
  parked_.clear();  // before the handle: UCX refuses to clean up while memory is still mapped
}

void Context::park(std::unique_ptr<MemoryRegion> region) {
  std::lock_guard lock(parked_mutex_);
  parked_.push_back(std::move(region));
}

uint64_t Context::registered_bytes() const {
  std::lock_guard lock(regions_mutex_);
  uint64_t sum = 0;
  for (const auto& [base, size] : regions_) sum += size;
  return sum;
}

bool Context::registered(uint64_t address, uint64_t length) const {
  std::lock_guard lock(regions_mutex_);
  for (const auto& [base, size] : regions_) {
    if (address >= base && length <= size && address - base <= size - length) return true;
  }
  return false;
}

// ----------------------------------------------------------------------------- MemoryRegion
namespace {
// What a failed ucp_mem_map most likely ran into on this transport.
const char* map_failure(const Context& ctx) {
  if (ctx.traits().registers_memory) {
    return "ucp_mem_map (the NIC could not pin the memory: is the locked-memory limit, ulimit -l, too low?)";
  }
  if (ctx.transport() == Transport::kShm) {
    return "ucp_mem_map (out of shared memory? UCX allocates SysV segments or /dev/shm files for it)";
  }
  return "ucp_mem_map";
}

// Whether the NIC may pin `length` more bytes under the locked-memory limit: asked before UCX
// registers anything (a failure inside UCX names nothing to change).
Status pinnable(const Context& ctx, size_t length) {
  return check_memlock(ctx.spec(), pinned_estimate() + length,
                       "what is pinned already and a region of " + format_bytes(length));
}
}  // namespace

Status MemoryRegion::allocate(Context& ctx, size_t length, std::unique_ptr<MemoryRegion>* out) {
  // Asked before UCX is: a region larger than the host (or container) can give would be written
  // into shared memory until the machine runs out (UCX tries one allocator after another; its POSIX
  // one writes the whole length first) — 24 GB of /dev/shm and OOM kills for a 100 GiB option.
  if (const uint64_t available = available_memory(); length > available) {
    return {Code::kInvalidArgument, "cannot allocate " + format_bytes(length) + ": only " + format_bytes(available) +
                                        " of memory are available on this host (MemAvailable, or what a container's "
                                        "limit leaves); ask for less"};
  }
  SLOTSTREAM_RETURN_IF_ERROR(pinnable(ctx, length));
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  params.address = nullptr;
  params.length = length;
  params.flags = UCP_MEM_MAP_ALLOCATE;
  ucp_mem_h mem = nullptr;
  ucs_status_t st = ucp_mem_map(ctx.handle(), &params, &mem);
  if (st != UCS_OK) return from_ucs(st, map_failure(ctx));
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
  st = ucp_mem_query(mem, &attr);
  if (st != UCS_OK) {
    ucp_mem_unmap(ctx.handle(), mem);
    return from_ucs(st, "ucp_mem_query");
  }
  // Fresh pages are zero (Context::create); clearing them would commit every page at once.
  if (!ctx.zero_filled_) std::memset(attr.address, 0, length);
  raise_max(g_counters.registered_max, g_counters.registered_now.fetch_add(length) + length);
  if (ctx.traits().registers_memory) g_pinned_regions.fetch_add(length);
  out->reset(new MemoryRegion(ctx, mem, static_cast<std::byte*>(attr.address), length));
  {
    std::lock_guard lock(ctx.regions_mutex_);
    ctx.regions_.emplace_back(reinterpret_cast<uint64_t>(attr.address), length);
  }
  return Status::ok();
}

Status MemoryRegion::map(Context& ctx, void* address, size_t length, std::unique_ptr<MemoryRegion>* out) {
  SLOTSTREAM_RETURN_IF_ERROR(pinnable(ctx, length));
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  params.address = address;
  params.length = length;
  ucp_mem_h mem = nullptr;
  ucs_status_t st = ucp_mem_map(ctx.handle(), &params, &mem);
  if (st != UCS_OK) return from_ucs(st, map_failure(ctx));
  raise_max(g_counters.registered_max, g_counters.registered_now.fetch_add(length) + length);
  if (ctx.traits().registers_memory) g_pinned_regions.fetch_add(length);
  out->reset(new MemoryRegion(ctx, mem, static_cast<std::byte*>(address), length));
  {
    std::lock_guard lock(ctx.regions_mutex_);
    ctx.regions_.emplace_back(reinterpret_cast<uint64_t>(address), length);
  }
  return Status::ok();
}

MemoryRegion::~MemoryRegion() {
  {
    std::lock_guard lock(ctx_.regions_mutex_);
    auto& r = ctx_.regions_;
    auto it = std::find(r.begin(), r.end(), std::make_pair(reinterpret_cast<uint64_t>(data_), uint64_t(size_)));
    if (it != r.end()) r.erase(it);
  }
  ucp_mem_unmap(ctx_.handle(), mem_);
  g_counters.registered_now.fetch_sub(size_);
  if (ctx_.traits().registers_memory) g_pinned_regions.fetch_sub(size_);
}

Status MemoryRegion::allocate_exposed(Context& ctx, size_t length, ExposedRegion* out) {
  ExposedRegion exposed;
  SLOTSTREAM_RETURN_IF_ERROR(allocate(ctx, length, &exposed.region));
  SLOTSTREAM_RETURN_IF_ERROR(exposed.region->pack_rkey(&exposed.rkey));
  *out = std::move(exposed);
  return Status::ok();
}

Status MemoryRegion::pack_rkey(std::vector<uint8_t>* out) const {
  void* buf = nullptr;
  size_t len = 0;
  ucs_status_t st = ucp_rkey_pack(ctx_.handle(), mem_, &buf, &len);
  if (st != UCS_OK) return from_ucs(st, "ucp_rkey_pack");
  out->assign(static_cast<uint8_t*>(buf), static_cast<uint8_t*>(buf) + len);
  ucp_rkey_buffer_release(buf);
  return Status::ok();
}

// -------------------------------------------------------------------------------- RemoteKey
Status RemoteKey::unpack(Endpoint& ep, std::span<const uint8_t> packed, std::unique_ptr<RemoteKey>* out) {
  ucp_rkey_h rkey = nullptr;
  ucs_status_t st = ucp_ep_rkey_unpack(ep.handle(), packed.data(), &rkey);
  if (st != UCS_OK) return from_ucs(st, "ucp_ep_rkey_unpack");
  out->reset(new RemoteKey(rkey));
  return Status::ok();
}

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
  // Then sleep up to 1 ms at a time: the answer that completes the operation ends the sleep, and a
  // stalled or stopped peer costs no core. The spin is bounded in time because the answer may need
  // the core this thread spins on: the receiver's progress thread waits for one on a busy host.
  // (Spinning 2,048 progress calls, ~0.9 ms over tcp, then sleeping blind, put a millisecond into
  // 1 % of the one-message latencies on two cores; spinning 100 µs per status read over tcp made
  // status_byte's sender cost more CPU per MB than the sliding window's, docs/benchmarks.md.)
  using Clock = std::chrono::steady_clock;
  constexpr auto kMaxSleep = std::chrono::microseconds(1000);
  Status st = check();
  if (st.code() != Code::kInProgress) return st;
  const auto start = Clock::now();
  const auto spin_until = start + wait_policy::spin_budget(worker.typical_completion());
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
      sleep = std::min(kMaxSleep, sleep * 2);
    }
    // Spinning, the clock is read every 256 turns; sleeping, every turn: 256 sleeps of "1 ms" are
    // 0.3 s on an idle host and seconds on a loaded one, late for a stall timeout.
    if (alive && (sleeping || (spins & 255) == 0) && Clock::now() >= next_check) {
      SLOTSTREAM_RETURN_IF_ERROR(alive());
      next_check = Clock::now() + std::chrono::milliseconds(1);
    }
  }
}

namespace {
// `get_of`: the endpoint, for a get (Request::release).
Status track(ucs_status_ptr_t ptr, const char* what, Request* req, Endpoint* get_of = nullptr) {
  if (ptr == nullptr) return Status::ok();
  if (UCS_PTR_IS_ERR(ptr)) return from_ucs(UCS_PTR_STATUS(ptr), what);
  op_started();
  *req = Request(ptr, get_of);
  return Status::ok();
}
}  // namespace

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

// ----------------------------------------------------------------------------------- Worker
Status Worker::create(Context& ctx, bool shared, bool wakeup, std::unique_ptr<Worker>* out) {
  const bool rdma = ctx.transport() == Transport::kRdma;
  if (rdma) {
    // Before UCX pins anything: a limit too low fails here, with what to do, not inside UCX.
    SLOTSTREAM_RETURN_IF_ERROR(check_memlock(ctx.spec(), pinned_estimate() + worker_pinned_bytes(ctx.spec()),
                                             "what is pinned already and a new worker"));
    // UCX 1.13 asserts (SIGABRT) when a listener is created on a worker without a connection
    // manager: rdma's is rdmacm.
    if (!rdma_cm_available()) {
      return {Code::kInvalidArgument,
              "rdma needs the RDMA connection manager: /dev/infiniband/rdma_cm is missing or not accessible (load the "
              "rdma_ucm module)"};
    }
  }
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  // Unshared: one thread at a time, not always the same one (a sender's filler transmits itself
  // when it holds the lane's transmit token, stream/send_ring.h) — UCX's serialized mode.
  params.thread_mode = shared ? UCS_THREAD_MODE_MULTI : UCS_THREAD_MODE_SERIALIZED;
  if (wakeup) {
    params.field_mask |= UCP_WORKER_PARAM_FIELD_EVENTS;
    params.events =
        UCP_WAKEUP_RMA | UCP_WAKEUP_AMO | UCP_WAKEUP_TAG_RECV | UCP_WAKEUP_TAG_SEND | UCP_WAKEUP_TX | UCP_WAKEUP_RX;
  }
  ucp_worker_h handle = nullptr;
  ucs_status_t st = ucp_worker_create(ctx.handle(), &params, &handle);
  if (st != UCS_OK) return from_ucs(st, "ucp_worker_create");
  std::unique_ptr<Worker> w(new Worker(ctx, handle));
  if (rdma) g_pinned_workers.fetch_add(1);

  if (ctx.traits().cm_connect) {
    // Peers connect through a listener (cm.h), never by worker address.
    SLOTSTREAM_RETURN_IF_ERROR(CmListener::create(handle, &w->listener_));
    CmAddress address{w->listener_->ports()};
    if (rdma) {
      // The word a peer reads to prove the NIC reaches this worker's memory (Endpoint::create).
      SLOTSTREAM_RETURN_IF_ERROR(MemoryRegion::allocate(ctx, 64, &w->probe_));
      SLOTSTREAM_RETURN_IF_ERROR(w->probe_->pack_rkey(&address.probe_rkey));
      address.probe_address = w->probe_->remote_address();
    }
    w->address_ = encode_cm_address(address);
  } else {
    ucp_address_t* addr = nullptr;
    size_t addr_len = 0;
    st = ucp_worker_get_address(handle, &addr, &addr_len);
    if (st != UCS_OK) return from_ucs(st, "ucp_worker_get_address");
    auto* bytes = reinterpret_cast<uint8_t*>(addr);
    w->address_.assign(bytes, bytes + addr_len);
    ucp_worker_release_address(handle, addr);
  }

  if (wakeup) {
    st = ucp_worker_get_efd(handle, &w->event_fd_);
    if (st != UCS_OK) return from_ucs(st, "ucp_worker_get_efd");
  }
  // tcp has no one-sided transport: the fabric carries puts and gets itself (soft_rma.h). rdma
  // and shm take UCX's own one-sided operations.
  if (ctx.traits().soft_rma) SLOTSTREAM_RETURN_IF_ERROR(SoftRma::create(*w, &w->soft_));
  *out = std::move(w);
  return Status::ok();
}

Worker::Worker(Context& ctx, ucp_worker* handle) : ctx_(ctx), handle_(handle) {}

Worker::~Worker() {
  if (ctx_.transport() == Transport::kRdma) g_pinned_workers.fetch_sub(1);
  listener_.reset();  // closes the endpoints it accepted
  soft_.reset();      // its handlers and replies use the worker
  handle_.reset();    // before the AM handlers it may still point to
  kept_.clear();      // buffers of requests that ended with the worker
}

void Worker::keep(std::shared_ptr<const void> buffer) {
  std::lock_guard lock(kept_mutex_);
  kept_.push_back(std::move(buffer));
}

unsigned Worker::progress() {
  const auto t0 = std::chrono::steady_clock::now();
  const unsigned n = ucp_worker_progress(handle());
  if (soft_) soft_->reap();
  if (listener_) listener_->reap();
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  g_counters.progress_calls.fetch_add(1, std::memory_order_relaxed);
  g_counters.progress_ns.fetch_add(uint64_t(ns), std::memory_order_relaxed);
  if (n != 0) g_counters.progress_useful.fetch_add(1, std::memory_order_relaxed);
  return n;
}

unsigned Worker::progress_setup() {
  const unsigned n = ucp_worker_progress(handle());
  if (soft_) soft_->reap();
  g_counters.setup_progress_calls.fetch_add(1, std::memory_order_relaxed);
  return n;
}

Status Worker::fence() { return from_ucs(ucp_worker_fence(handle()), "ucp_worker_fence"); }

Status Worker::wait_for_event(std::chrono::microseconds timeout) {
  if (event_fd_ < 0) return {Code::kInvalidArgument, "worker created without wakeup"};
  // Drain everything first; arm only when UCX says it is idle (UCS_ERR_BUSY means: progress more).
  bool worked = false;
  while (progress() != 0) worked = true;
  if (worked) return Status::ok();
  ucs_status_t st = ucp_worker_arm(handle());
  if (st == UCS_ERR_BUSY) return Status::ok();
  if (st != UCS_OK) return from_ucs(st, "ucp_worker_arm");
  pollfd pfd{event_fd_, POLLIN, 0};
  // ppoll counts microseconds: the short waits of PollBackoff::pause(worker) sleep as long as
  // asked (a millisecond poll() would round them up to 1 ms), and a zero timeout is not asked for.
  const auto us = std::max<int64_t>(1, timeout.count());
  const timespec ts{static_cast<time_t>(us / 1000000), static_cast<long>(us % 1000000) * 1000};
  int rc = ::ppoll(&pfd, 1, &ts, nullptr);
  if (rc < 0 && errno != EINTR) return {Code::kTransportError, std::string("poll: ") + strerror(errno)};
  return Status::ok();
}

void Worker::wait_or_sleep(std::chrono::microseconds timeout) {
  if (!wait_for_event(timeout).is_ok()) std::this_thread::sleep_for(timeout);
}

void Worker::signal() { ucp_worker_signal(handle()); }

void Worker::note_completion(std::chrono::nanoseconds sample) {
  const auto typical = wait_policy::update_typical(typical_completion(), sample);
  typical_completion_ns_.store(typical.count(), std::memory_order_relaxed);
}

Status Worker::am_reply(ReplyEp to, unsigned id, const void* header, size_t header_len, Request* req) {
  if (!to) return {Code::kPeerGone, "no reply endpoint"};
  ucp_request_param_t param{};
  g_counters.am_sends.fetch_add(1, std::memory_order_relaxed);
  return track(ucp_am_send_nbx(to.ep, id, header, header_len, nullptr, 0, &param), "ucp_am_send_nbx (reply)", req);
}

Status Worker::tag_recv(void* dst, size_t length, uint64_t tag, TagReceive* out) {
  *out = TagReceive();
  // Always a request, also when the message is already here: then it is complete at once and
  // check() reads its length (the immediate-completion path of UCX 1.13 left the length unset).
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  g_counters.tag_receives.fetch_add(1, std::memory_order_relaxed);
  ucs_status_ptr_t p = ucp_tag_recv_nbx(handle(), dst, length, tag, ~uint64_t(0), &param);
  if (UCS_PTR_IS_ERR(p)) return from_ucs(UCS_PTR_STATUS(p), "ucp_tag_recv_nbx");
  if (p == nullptr) return {Code::kTransportError, "ucp_tag_recv_nbx returned no request"};
  op_started();
  out->req_ = p;
  out->worker_ = handle();
  // Complete already: it matched a message that was waiting in UCX's unexpected queue, i.e.
  // one sent before this receive was posted.
  if (ucp_request_check_status(p) != UCS_INPROGRESS) {
    out->unexpected_ = true;
    g_counters.tag_unexpected.fetch_add(1, std::memory_order_relaxed);
  }
  return Status::ok();
}

Status Worker::set_am_handler(unsigned id, AmHandler handler, AmRegistration* out) {
  out->reset();  // first: it may hold this very id
  SLOTSTREAM_RETURN_IF_ERROR(install_am_handler(id, std::move(handler)));
  out->worker_ = this;
  out->id_ = id;
  return Status::ok();
}

void AmRegistration::reset() {
  if (worker_ == nullptr) return;
  // A no-op rather than no handler: UCX warns about every message for an id without one.
  Status st = std::exchange(worker_, nullptr)
                  ->install_am_handler(id_, [](std::span<const std::byte>, std::span<const std::byte>, ReplyEp) {});
  if (!st.is_ok()) spdlog::warn("unhooking active-message handler {}: {}", id_, st.to_string());
}

Status Worker::install_am_handler(unsigned id, AmHandler handler) {
  am_handlers_.push_back(std::make_unique<AmHandler>(std::move(handler)));
  ucp_am_handler_param_t param{};
  param.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
  param.id = id;
  param.arg = am_handlers_.back().get();
  param.cb = [](void* arg, const void* header, size_t header_len, void* data, size_t length,
                const ucp_am_recv_param_t* recv) -> ucs_status_t {
    auto& fn = *static_cast<AmHandler*>(arg);
    g_counters.am_received.fetch_add(1, std::memory_order_relaxed);
    // Protocols in slotstream send small notifications only; rendezvous data is not expected.
    if (recv->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) return UCS_OK;
    ReplyEp reply;
    if (recv->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) reply.ep = recv->reply_ep;
    fn({static_cast<const std::byte*>(header), header_len}, {static_cast<const std::byte*>(data), length}, reply);
    return UCS_OK;
  };
  return from_ucs(ucp_worker_set_am_recv_handler(handle(), &param), "ucp_worker_set_am_recv_handler");
}

// --------------------------------------------------------------------------- ProgressThread
struct ProgressThread::Impl {
  Worker& worker;
  std::atomic<bool> stop{false};
  std::thread thread;
  explicit Impl(Worker& w) : worker(w) {
    thread = std::thread([this] {
      while (!stop.load(std::memory_order_acquire)) {
        Status st = worker.wait_for_event();
        if (!st.is_ok()) {
          spdlog::error("receiver progress thread: {}", st.to_string());
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
      }
    });
  }
};

ProgressThread::ProgressThread(Worker& worker) : impl_(std::make_unique<Impl>(worker)) {}

ProgressThread::~ProgressThread() {
  impl_->stop.store(true, std::memory_order_release);
  impl_->worker.signal();
  impl_->thread.join();
}

}  // namespace slotstream::fabric
