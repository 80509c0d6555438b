// The edge server (include/slotstream/edge.h): each device's route (here or through the platform), the
// moves the offload policy decides, and the messages a moving device holds meanwhile.
#include "slotstream/edge.h"

#include <chrono>
#include <cstdio>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "slotstream/sinks.h"

namespace slotstream {

namespace {

using Clock = std::chrono::steady_clock;

// Messages a device produces while a move changes where it goes wait in the edge instead of
// stalling its filler: a move finishes the remote connection and connects again (0.4-0.9 s seen
// on a loaded 2-core VM), longer than a synthetic camera's frame slot may wait (the frames would
// be skipped). Beyond this many bytes over all devices, fillers wait for the move; the platform
// sender keeps as much for replay (PlatformSenderOptions::replay_limit).
constexpr uint64_t kMoveHoldBytes = 256ull << 20;

// One device: processed here (its own sink: a DirSink, or the pipeline's with workers) or sent
// through the platform. The filler holds `mutex` for a message; a move takes it to change where
// the device goes, and holds the device's new messages meanwhile (`moving`: they wait in `held`,
// in order, and go to the device's new place when the move is done).
struct Route {
  std::mutex mutex;
  bool remote = false;
  bool moving = false;
  std::deque<std::vector<std::byte>> held;
  Status error;  // a held message that could not be stored or sent: the device's filler fails with it
  std::unique_ptr<MessageSink> local;
  uint64_t first = 0;  // the number of this run's first message (the local directory's next one)
  EdgeDeviceStats stats;
};

}  // namespace

struct EdgeServer::Impl {
  Impl(EdgeServerOptions o, PlatformSender& r) : options(std::move(o)), remote(r) {}

  Route& route(uint16_t d) { return *routes.at(d); }
  PlatformNeed need_for(size_t devices) const {
    const PlatformNeed& p = options.per_device;
    return {p.cpu * devices, p.bandwidth * devices, p.fps * devices};
  }
  void event(const std::string& text) const {
    if (options.on_event) options.on_event(text);
  }
  Status deliver(Route& r, uint16_t d, std::span<const std::byte> message);
  bool hold(Route& r, std::vector<std::byte>& message);
  void move(OffloadMove m, double load);
  void hold_route(uint16_t t);
  void land(uint16_t d, const std::map<uint16_t, uint64_t>& removed, bool offloaded);
  Status check_numbers(uint16_t d, Route& r, const std::map<uint16_t, uint64_t>& removed);

  EdgeServerOptions options;
  PlatformSender& remote;
  std::map<uint16_t, std::unique_ptr<Route>> routes;
  std::vector<uint16_t> offloaded;  // in the order they went
  std::atomic<uint64_t> held_bytes{0};
  uint64_t moves = 0, refused = 0, reconnect_moves = 0;
  std::vector<double> move_ms;  // each move, from its decision until its devices landed
};

// Stores one message here or sends it through the platform, wherever the device goes now.
// Under r.mutex. kBusy: the local worker is behind (nothing was stored; retry).
Status EdgeServer::Impl::deliver(Route& r, uint16_t d, std::span<const std::byte> message) {
  if (r.remote) {
    SLOTSTREAM_RETURN_IF_ERROR(remote.send(d, message));
    ++r.stats.remote;
    return Status::ok();
  }
  Status st = r.local->begin(d);
  if (st.code() == Code::kBusy) return st;
  if (st.is_ok()) st = r.local->append(d, message);
  if (st.is_ok()) st = r.local->commit(d);
  if (!st.is_ok()) {
    r.local->abort(d);
    return st;
  }
  ++r.stats.local;
  return Status::ok();
}

// Keeps a message of a moving device (taking it from `message`); false when the hold is full.
// Under r.mutex.
bool EdgeServer::Impl::hold(Route& r, std::vector<std::byte>& message) {
  if (!r.held.empty() && held_bytes.load() + message.size() > kMoveHoldBytes) return false;
  held_bytes += message.size();
  ++r.stats.held;
  r.held.push_back(std::move(message));
  return true;
}

// After a move: where device d goes now (a device given back continues here after the last
// number its receiver stored), then what it held meanwhile, in order.
void EdgeServer::Impl::land(uint16_t d, const std::map<uint16_t, uint64_t>& removed, bool was_offloaded) {
  Route& r = route(d);
  std::unique_lock lock(r.mutex);
  if (was_offloaded) r.remote = true;
  if (auto it = removed.find(d); it != removed.end()) {
    r.remote = false;
    std::erase(offloaded, d);
    auto* numbered = dynamic_cast<SkippableSink*>(r.local.get());
    Status st = numbered ? numbered->skip_to(d, it->second)
                         : Status{Code::kInvalidArgument, "its local sink cannot continue at a number"};
    if (!st.is_ok()) {
      r.error = {st.code(), "device " + std::to_string(d) + " came back to continue at message " +
                                std::to_string(it->second) + ", but: " + st.message()};
    }
  }
  while (!r.held.empty() && r.error.is_ok()) {
    Status st = deliver(r, d, r.held.front());
    if (st.code() == Code::kBusy) {  // the worker is behind: the filler waits meanwhile (hold full) or holds on
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      lock.lock();
      continue;
    }
    if (!st.is_ok()) r.error = st;
    held_bytes -= r.held.front().size();
    r.held.pop_front();
  }
  r.moving = false;
}

// Marks device t moving: its new messages wait in the edge until land(). Waits for a message on
// its way (a remote one may wait for its receiver).
void EdgeServer::Impl::hold_route(uint16_t t) {
  Route& r = route(t);
  std::lock_guard lock(r.mutex);
  r.moving = true;
  ++r.stats.holds;
}

// One move. The moving device holds its new messages while the platform sender changes its set; the
// devices already offloaded keep their connection and keep flowing (a move in place: a per-device
// end or NUMBER on the open connection) — unless the move must reconnect (its receiver has no room
// for one more device, or a take-back of the last one ends the connection): then they hold theirs
// too, so that none goes either way meanwhile and no filler stalls.
void EdgeServer::Impl::move(OffloadMove m, double load) {
  uint16_t d = 0;
  if (m == OffloadMove::kOffload) {
    for (auto& [dev, r] : routes) {
      if (!r->remote) d = dev;  // the highest-numbered local device
    }
  } else {
    d = offloaded.back();
  }
  std::vector<uint16_t> set = offloaded, touched = {d};
  std::map<uint16_t, uint64_t> next, removed;
  char why[128];
  if (m == OffloadMove::kOffload) {
    set.push_back(d);
    std::snprintf(why, sizeof why, "load %.1f above %.1f: offloading device %u", load, options.policy.above,
                  unsigned(d));
  } else {
    std::erase(set, d);
    std::snprintf(why, sizeof why, "load %.1f below %.1f: taking device %u back", load, options.policy.below,
                  unsigned(d));
  }
  event(why);
  const auto t0 = Clock::now();
  hold_route(d);
  if (m == OffloadMove::kOffload) {
    Route& r = route(d);
    std::lock_guard lock(r.mutex);
    next[d] = r.local->numbering(d)->next;  // no local message now
  }
  auto reconnecting = [&] {  // the devices offloaded already go through the new connection too
    for (uint16_t t : offloaded) {
      if (t != d) {
        hold_route(t);
        touched.push_back(t);
      }
    }
    if (touched.size() > 1) ++reconnect_moves;
  };
  Status st = remote.set_devices(set, next, need_for(set.size()), &removed, reconnecting);
  ++moves;
  if (!st.is_ok()) {
    ++refused;
    event("no receiver for the move, processing here: " + st.message());
  }
  const bool went = st.is_ok() && m == OffloadMove::kOffload;
  if (went) offloaded.push_back(d);
  for (uint16_t t : touched) land(t, removed, went && t == d);
  move_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
}

// Device d's numbers run on: this run's first number plus every message it handed on is where
// its next message would go, here or (`removed`: it ended offloaded) on its receiver.
Status EdgeServer::Impl::check_numbers(uint16_t d, Route& r, const std::map<uint16_t, uint64_t>& removed) {
  std::lock_guard lock(r.mutex);
  if (!r.error.is_ok()) return r.error;
  auto it = removed.find(d);
  const uint64_t end = it != removed.end() ? it->second : r.local->numbering(d).value_or(MessageSink::Numbering{}).next;
  const uint64_t handed = r.stats.local + r.stats.remote;
  if (end == r.first + handed) return Status::ok();
  return {Code::kProtocolError, "device " + std::to_string(d) + ": " + std::to_string(handed) +
                                    " messages were stored here or sent, but their numbers run from " +
                                    std::to_string(r.first) + " to " + std::to_string(end) +
                                    " (some are missing or stored twice): report this as a bug"};
}

EdgeServer::EdgeServer(EdgeServerOptions options, PlatformSender& remote)
    : impl_(std::make_unique<Impl>(std::move(options), remote)) {}

EdgeServer::~EdgeServer() = default;

void EdgeServer::add(uint16_t d, std::unique_ptr<MessageSink> sink) {
  auto r = std::make_unique<Route>();
  r->first = sink->numbering(d).value_or(MessageSink::Numbering{}).next;
  r->local = std::move(sink);
  impl_->routes[d] = std::move(r);
}

// A busy sink (the worker is behind) or a full hold is retried without holding the route, so that a
// move can take the device meanwhile.
Status EdgeServer::send_with(uint16_t d, uint64_t length, const DeviceStream::FillFn& fill) {
  std::vector<std::byte> message(length);
  SLOTSTREAM_RETURN_IF_ERROR(fill(0, message));
  Route& r = impl_->route(d);
  for (;;) {
    {
      std::lock_guard lock(r.mutex);
      if (!r.error.is_ok()) return r.error;
      if (r.moving) {
        if (impl_->hold(r, message)) return Status::ok();
      } else if (Status st = impl_->deliver(r, d, message); st.code() != Code::kBusy) {
        return st;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void EdgeServer::control(const std::atomic<bool>& done) {
  Impl& im = *impl_;
  std::optional<Clock::time_point> last_move;
  while (!done.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const double l = im.options.load ? im.options.load() : 0;
    std::optional<Clock::duration> since;
    if (last_move) since = Clock::now() - *last_move;
    const size_t remote = im.offloaded.size(), local = im.routes.size() - remote;
    const OffloadMove m = decide_offload(im.options.policy, l, local, remote, since);
    if (m == OffloadMove::kNone) continue;
    im.move(m, l);
    last_move = Clock::now();
  }
}

// FIN/FIN_ACK with the receiver, then the numbers.
Status EdgeServer::finish() {
  std::map<uint16_t, uint64_t> removed;
  SLOTSTREAM_RETURN_IF_ERROR(impl_->remote.set_devices({}, {}, {}, &removed));
  for (auto& [d, r] : impl_->routes) SLOTSTREAM_RETURN_IF_ERROR(impl_->check_numbers(d, *r, removed));
  return Status::ok();
}

EdgeServerStats EdgeServer::stats() const {
  EdgeServerStats s;
  for (const auto& [d, r] : impl_->routes) s.devices[d] = r->stats;
  s.moves = impl_->moves;
  s.refused_moves = impl_->refused;
  s.reconnect_moves = impl_->reconnect_moves;
  s.move_ms = impl_->move_ms;
  return s;
}

}  // namespace slotstream
