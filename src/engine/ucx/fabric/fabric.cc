// The fabric's statuses and counters, and the UCX context and memory: Context, MemoryRegion, RemoteKey.
// Request, Endpoint and TagReceive are in endpoint.cc, Worker and ProgressThread in worker.cc.
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
using internal::g_counters;
using internal::g_pinned_regions;
using internal::g_pinned_workers;
using internal::raise_max;

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

}  // namespace

namespace internal {
AtomicCounters g_counters;
std::atomic<uint64_t> g_pinned_workers{0}, g_pinned_regions{0};
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
  // Every worker is gone, and with it every send that still read a released region.
  for (const WaitingUnmap& w : waiting_unmaps_) unmap(w.mem, w.length);
}

void Context::unmap(ucp_mem* mem, uint64_t length) {
  ucp_mem_unmap(handle(), mem);
  g_counters.registered_now.fetch_sub(length);
  if (traits().registers_memory) g_pinned_regions.fetch_sub(length);
}

uint64_t Context::in_flight(uint64_t address, uint64_t length) {
  std::lock_guard lock(flight_mutex_);
  in_flight_.push_back({next_ticket_, address, length});
  return next_ticket_++;
}

bool Context::in_flight_within(uint64_t address, uint64_t length) const {
  return std::any_of(in_flight_.begin(), in_flight_.end(),
                     [&](const InFlight& f) { return f.address < address + length && address < f.address + f.length; });
}

void Context::done_in_flight(uint64_t ticket) {
  std::vector<WaitingUnmap> ready;
  {
    std::lock_guard lock(flight_mutex_);
    std::erase_if(in_flight_, [&](const InFlight& f) { return f.ticket == ticket; });
    std::erase_if(waiting_unmaps_, [&](const WaitingUnmap& w) {
      if (in_flight_within(w.address, w.length)) return false;
      ready.push_back(w);
      return true;
    });
  }
  for (const WaitingUnmap& w : ready) unmap(w.mem, w.length);
}

size_t Context::unmaps_waiting() const {
  std::lock_guard lock(flight_mutex_);
  return waiting_unmaps_.size();
}

void Context::park(std::unique_ptr<MemoryRegion> region) {
  std::lock_guard lock(parked_mutex_);
  parked_.push_back(std::move(region));
}

uint64_t Context::registered_bytes() const {
  std::shared_lock lock(regions_mutex_);
  uint64_t sum = 0;
  for (const auto& [base, size] : regions_) sum += size;
  return sum;
}

bool Context::registered(uint64_t address, uint64_t length) const {
  auto hold = hold_registrations();
  return registered_held(address, length);
}

bool Context::registered_held(uint64_t address, uint64_t length) const {
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
  out->reset(new MemoryRegion(ctx, mem, static_cast<std::byte*>(attr.address), length, /*allocated=*/true));
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
  out->reset(new MemoryRegion(ctx, mem, static_cast<std::byte*>(address), length, /*allocated=*/false));
  {
    std::lock_guard lock(ctx.regions_mutex_);
    ctx.regions_.emplace_back(reinterpret_cast<uint64_t>(address), length);
  }
  return Status::ok();
}

MemoryRegion::~MemoryRegion() {
  const uint64_t address = reinterpret_cast<uint64_t>(data_);
  {
    std::lock_guard lock(ctx_.regions_mutex_);
    auto& r = ctx_.regions_;
    auto it = std::find(r.begin(), r.end(), std::make_pair(address, uint64_t(size_)));
    if (it != r.end()) r.erase(it);
  }
  // No send starts reading it from here on (a peer's get is checked against the registrations, and
  // its reply marked in flight, under one hold of them); one that already does keeps it mapped.
  if (allocated_) {
    std::lock_guard lock(ctx_.flight_mutex_);
    if (ctx_.in_flight_within(address, size_)) {
      ctx_.waiting_unmaps_.push_back({mem_, address, size_});
      return;
    }
  }
  ctx_.unmap(mem_, size_);
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

std::byte* RemoteKey::local(uint64_t remote_addr) {
  if (unmapped_.load(std::memory_order_relaxed)) return nullptr;
  void* ptr = nullptr;
  if (ucp_rkey_ptr(handle(), remote_addr, &ptr) != UCS_OK) {
    // UNREACHABLE/UNSUPPORTED: no transport of this key maps memory (tcp, rdma, self).
    unmapped_.store(true, std::memory_order_relaxed);
    return nullptr;
  }
  return static_cast<std::byte*>(ptr);
}

}  // namespace slotstream::fabric
