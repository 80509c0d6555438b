// The datagram receiver's storing thread: the messages its sessions hand over (Session::release),
// stored one at a time in their order, each session into its MessageStore (engine/dgram/recv/stores.h).
//
// A store that answers kBusy for a device (its worker is behind, src/pipeline/worker_manager.h) pauses
// that device alone: its messages wait here, in order, and are tried again every 100 ms, while the
// other devices and sessions go on. The network thread reads each session's state (StoreState) to act
// on it: a paused device's UD messages are dropped and counted, an RD session grants no credits and an
// RC session's connection is not read while one of its devices is paused (the sender slows down), and
// every session's backlog (bytes queued here) is bounded. Any other failure (a full disk) concerns
// every session: it is retried every 100 ms, and reported. A FIN marker, queued once a session has
// released every message, is reached only after all of them are stored: then the session is done.
// Threading: push() from the network thread; StoreState from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "engine/dgram/recv/log_limit.h"
#include "engine/dgram/recv/session.h"
#include "engine/dgram/recv/stores.h"

namespace slotstream::dgram {

// One session's store, and what the storing thread tells the network thread about it.
class StoreState {
 public:
  StoreState(std::string name, std::unique_ptr<MessageStore> store)
      : name_(std::move(name)),
        store_(std::move(store)) {}
  const std::string& name() const { return name_; }
  uint64_t backlog() const { return backlog_.load(); }    // bytes queued for the store
  bool stored_all() const { return stored_all_.load(); }  // the FIN marker was reached
  bool any_paused() const { return paused_devices_.load() > 0; }
  bool paused(uint16_t device) const;
  struct Pause {
    uint64_t count = 0;  // times the device was paused
    bool now = false;
  };
  std::map<uint16_t, Pause> pauses() const;

 private:
  friend class StoreQueue;
  void set_paused(uint16_t device, bool on);

  const std::string name_;
  const std::unique_ptr<MessageStore> store_;  // nullptr: nothing is stored (messages are only counted)
  std::atomic<uint64_t> backlog_{0};
  std::atomic<bool> stored_all_{false};
  std::atomic<int> paused_devices_{0};
  mutable std::mutex mu_;
  std::map<uint16_t, Pause> pauses_;
};

class StoreQueue {
 public:
  // `wake`: called (on the storing thread) when a FIN marker was reached, so that the network thread
  // ends the session without waiting for its next turn.
  StoreQueue(EventLog& log, std::function<void()> wake);
  ~StoreQueue();  // stop()
  void start();
  // Ends the thread; messages not yet stored are discarded. Any thread, once.
  void stop();

  void push(std::shared_ptr<StoreState> s, Session::Ready r);
  void push_fin(std::shared_ptr<StoreState> s);
  uint64_t backlog() const { return backlog_.load(); }  // all sessions

 private:
  struct Item {
    std::shared_ptr<StoreState> state;
    bool fin_marker = false;
    Delivered delivered;
    Completion completion;  // owns delivered.data / valid
    uint64_t bytes = 0;
  };
  // What waits behind a paused device, per session (the storing thread's alone).
  struct Parked {
    std::map<uint16_t, std::deque<Item>> devices;
    std::optional<Item> fin;
  };

  void enqueue(Item w);
  void run();
  bool next(Item* w);
  void handle(Item& w);
  Status attempt(Item& w);
  void done(Item& w);
  void finish_fin(Item& w);
  void retry_parked();
  bool retry_device(std::deque<Item>& items);

  EventLog& log_;
  std::function<void()> wake_;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> backlog_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  std::map<StoreState*, Parked> parked_;
  int64_t next_retry_ns_ = 0;
  std::thread thread_;
};

}  // namespace slotstream::dgram
