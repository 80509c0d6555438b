// PlatformSender's state (PlatformSender::Impl) and its timing, shared by platform_sender.cc (connect, send,
// finish, recovery from a lost receiver, the platform watcher) and platform_sender_moves.cc (set_devices: a
// move in place on the open connection, or by reconnecting). Private to src/platform.
#pragma once

#include "slotstream/platform.h"

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <thread>

#include "net/control_socket.h"
#include "platform/etcd.h"
#include "platform/replay_log.h"
#include "platform/reservation.h"

namespace slotstream {

using Clock = std::chrono::steady_clock;
using platform::ReplayLog;

namespace {

// How long to wait before asking the platform again when no receiver has room or the chosen one
// cannot be reached, and how often a send() over the replay limit looks for confirmations.
constexpr auto kRetryPause = std::chrono::milliseconds(200);
constexpr auto kRoomPoll = std::chrono::milliseconds(2);
// A move in place waits this long at most for the receiver to confirm a leaving device's messages
// (STORED: every ~50 ms while it stores), or to answer NUMBER; then it moves by reconnecting,
// which also finds out whether the receiver died meanwhile.
constexpr auto kInPlaceWait = std::chrono::milliseconds(5000);
// How often the receiver's platform record is looked at (watch()), and how long the receiver must
// also have said nothing on the connection (it sends KEEPALIVE every second) before its record's
// absence counts as its loss: a live receiver whose lease lapsed while etcd was out of reach
// registers again and keeps its senders.
constexpr auto kWatchEvery = std::chrono::milliseconds(500);
constexpr auto kWatchSilence = std::chrono::milliseconds(1500);

// The receive memory a sender's connections take on the receiver (its blocks and status bytes,
// one region per connection).
inline bool connection_per_device(const SenderOptions& o) {
  const std::string name = o.protocol.substr(0, o.protocol.find(':'));
  for (const auto& p : protocols()) {
    if (p.name == name) return p.connection_per_device;
  }
  return false;
}

inline double receive_memory(const SenderOptions& o, size_t devices) {
  const size_t lanes = connection_per_device(o) ? devices : 1;
  return double(lanes) * (double(o.blocks) * o.block_size + o.blocks);
}

}  // namespace

struct PlatformSender::Impl {
  PlatformSenderOptions options;
  std::unique_ptr<platform::SenderLease> lease;

  // send(): shared; a move to another receiver (recover, finish, set_devices): exclusive.
  std::shared_mutex gate;
  std::unique_ptr<Sender> sender;  // the current connection; null: none
  uint64_t generation = 0;         // connections made; a failed send() names the one it used
  std::string receiver;
  std::mutex moves;                  // one set_devices() at a time
  mutable std::mutex devices_mutex;  // `devices` changes under the shared gate in a move in place
  std::vector<uint16_t> devices;     // sent through the platform now
  Status fatal;                      // no receiver could be found: every later call fails with it
  // abort(): `sender` is replaced under sender_mutex too, so that abort() reaches the current one.
  std::mutex sender_mutex;
  Status aborted;
  Status abort_status() {
    std::lock_guard lock(sender_mutex);
    return aborted;
  }
  // `p`: the receiver the new connection goes to, watched on the platform (watch()).
  void set_sender(std::unique_ptr<Sender> s, const platform::Placement* p = nullptr) {
    std::unique_ptr<Sender> old;
    std::lock_guard lock(sender_mutex);
    old = std::move(sender);
    sender = std::move(s);
    watched = p ? *p : platform::Placement{};
    if (sender && !aborted.is_ok()) sender->abort(aborted);
  }

  // The receiver's liveness as the platform sees it. A receiver that is stopped or hung keeps its
  // connection open and its blocks full; its lease running out (its record gone) together with its
  // silence on the connection says so, and the connection is given up: the next send() or finish()
  // moves to another receiver. Its own thread, with a client of its own.
  std::unique_ptr<platform::EtcdClient> watch_etcd;
  platform::Placement watched;  // under sender_mutex: the current connection's receiver
  std::mutex watch_mutex;
  std::condition_variable watch_wake;
  bool watch_stop = false;
  std::thread watcher;
  void watch();
  void check_receiver();
  void stop_watching() {
    {
      std::lock_guard lock(watch_mutex);
      watch_stop = true;
    }
    watch_wake.notify_all();
    if (watcher.joinable()) watcher.join();
  }

  struct Device {
    std::mutex mutex;  // the device's filler and whoever moves the stream
    ReplayLog log;
    uint64_t begin = 0;   // the log index the current connection (or the device's NUMBER on it) began at
    bool routed = false;  // sent through the platform now (in `devices`)
  };
  std::map<uint16_t, std::unique_ptr<Device>> streams;  // every device ever sent (changed exclusively)

  mutable std::mutex stats_mutex;
  PlatformSenderStats stats;

  void event(const std::string& text) const {
    if (options.on_event) options.on_event(text);
  }
  Device* stream(uint16_t d) {
    auto it = streams.find(d);
    return it == streams.end() ? nullptr : it->second.get();
  }
  // Drops what the receiver confirmed; learns the numbers from its first STORED. Under dev.mutex; for
  // a device sent now, or one leaving (drain).
  void trim(uint16_t d, Device& dev) {
    if (!sender) return;
    const Sender::Confirmed c = sender->confirmed(d);
    if (!c.first) return;
    if (!dev.log.base()) dev.log.learn_base(dev.begin, *c.first);
    dev.log.confirm(dev.begin, c.stored);
  }
  Status wait_for_room(uint16_t d, Device& dev, size_t bytes, std::optional<Clock::time_point> deadline);
  Status connect_to(const platform::Placement& p);
  Status replay();
  // keep_asking: ask again while no receiver has room (after a loss); else refuse at once.
  Status schedule(std::set<std::string> exclude, bool keep_asking);
  Status recover_locked(const Status& cause);
  Status recover(uint64_t gen, const Status& cause);
  Status finish_locked();
  Status send_owned(uint16_t d, std::vector<std::byte> message, std::optional<Clock::time_point> deadline = {});
  Status send_logged(uint16_t d, Device& dev, std::optional<Clock::time_point> deadline);
  // Every device a connection declares: those sent now and those that may come (movable).
  std::vector<uint16_t> declared() const;
  void set_routed(const std::vector<uint16_t>& set);
  bool can_move_in_place(const std::vector<uint16_t>& set, const std::map<uint16_t, uint64_t>& next);
  Status move_in_place(const std::vector<uint16_t>& set, const std::map<uint16_t, uint64_t>& next,
                       const PlatformNeed& need, std::map<uint16_t, uint64_t>* removed);
  Status drain(uint16_t d, uint64_t* next_number);
  void route_again(const std::vector<uint16_t>& ds);
  Status start(uint16_t d, uint64_t number);
  Status reconnect(const std::vector<uint16_t>& set, const std::map<uint16_t, uint64_t>& next, const PlatformNeed& need,
                   std::map<uint16_t, uint64_t>* removed);
};

}  // namespace slotstream
