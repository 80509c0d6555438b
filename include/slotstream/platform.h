// slotstream on the cloud-edge management platform (status-byte paper §3.1, Fig. 2), whose state
// lives in etcd: receivers register what they have free; a sender asks for a receiver with the
// resources it needs, gets one reserved atomically, and keeps streaming when that receiver dies —
// the platform gives it another and every message not confirmed stored is sent again, under the
// same numbers (docs/platform.md).
//
//   PlatformSender: connect -> send(device, ...) per filler thread -> finish()
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "slotstream/slotstream.h"

namespace slotstream {

// What a sender needs of a receiver, besides the receive memory its blocks take (computed from
// SenderOptions): processing in CPU cores, bandwidth in bytes/s, messages per second.
struct PlatformNeed {
  double cpu = 0;
  double bandwidth = 0;
  double fps = 0;
};

// How to reach a protected etcd (docs/platform.md, "Protecting the platform"). All empty: plain
// HTTP, no authentication — only for a network where nobody else can reach etcd.
struct PlatformSecurity {
  std::string cacert;  // PEM file: the CA the members' certificates must be signed by (TLS, https)
  std::string cert;    // PEM file: this client's certificate (etcd --client-cert-auth); with `key`
  std::string key;     // PEM file: its private key
  std::string user;    // etcd's own authentication (etcdctl auth enable): user and password
  std::string password;
  bool tls() const { return !cacert.empty() || !cert.empty(); }
};

struct PlatformSenderOptions {
  std::string platform;  // etcd://HOST:PORT[,HOST:PORT...]
  PlatformSecurity security;
  // name, protocol, transport, blocks, block size, token, devices. host/port are the platform's
  // choice; first_message and confirm_stored are set by the PlatformSender.
  SenderOptions sender;
  PlatformNeed need;
  int64_t lease_ttl_seconds = 5;  // a dead sender's reservation lasts this long
  // After losing its receiver: how long to look for another before giving up (a first request
  // that finds no receiver with room is refused at once).
  std::chrono::milliseconds patience{30000};
  // Most bytes of messages kept until confirmed stored; a send() beyond it waits for confirmations.
  uint64_t replay_limit = 256ull << 20;
  // Scheduling results, moves, losses, one line each (any thread; may be empty).
  std::function<void(const std::string&)> on_event;
  // Devices set_devices() may add later (the edge: all its devices). Every connection declares them
  // besides those sent now, so that one is moved onto the open connection (NUMBER, wire/control.h)
  // and off it while the others keep it — no new connection.
  std::vector<uint16_t> movable;
};

struct PlatformSenderStats {
  uint64_t messages = 0;        // send() calls completed
  uint64_t resent = 0;          // messages sent again to a new receiver
  uint64_t reschedules = 0;     // receivers lost and replaced
  uint64_t connections = 0;     // receivers connected to, in all
  uint64_t moves_in_place = 0;  // set_devices() calls done on the open connection
  std::string receiver;         // the current one ("" none)
  std::string transport;        // the last connection's (transport_name), and why it was chosen
  std::string transport_reason;
  std::vector<double> schedule_ms;  // per connection: from the scheduling request to connected
};

// Threading: send() of one device from one thread at a time, different devices concurrently (as
// DeviceStream); finish() and set_devices() from one thread while no send() is in progress... or
// while sends of other devices are (set_devices waits for the current messages).
class PlatformSender {
 public:
  // Schedules (reserves a receiver) and connects. kRefused says every receiver's shortfall.
  static Status connect(PlatformSenderOptions options, std::unique_ptr<PlatformSender>* out);
  ~PlatformSender();  // without finish(): the reservation goes, unsent messages are dropped

  // Like DeviceStream::send/send_with; the message is kept until the receiver confirms it stored.
  Status send(uint16_t device, std::span<const std::byte> message);
  Status send_with(uint16_t device, uint64_t length, const DeviceStream::FillFn& fill);
  // The same, giving up at `deadline` with kTimeout — the message not taken (call again to send it)
  // — while it waits for confirmations (replay_limit) or for a free send block before the message's
  // first fragment; a message whose first fragment went is sent in full.
  Status send(uint16_t device, std::span<const std::byte> message, std::chrono::steady_clock::time_point deadline);
  // Waits until every message is stored (moving to another receiver if this one dies meanwhile),
  // then releases the reservation and disconnects.
  Status finish();
  // Ends the stream at once from any thread (a caller's time limit, Ctrl-C in Python): the current
  // connection is aborted (Sender::abort), sends and finish() in progress return `why` within
  // ~100 ms, and so does every later call. What the receiver stored stays stored. Destroy as usual.
  void abort(Status why);

  // The edge's moves. `next` names the on-disk number of the next message of each added device.
  // Devices removed are given back with the number their next message must get wherever they go
  // (`*removed`), once every message of theirs is confirmed stored.
  // In place, when a connection is open, the new set is not empty, every added device is declared
  // on it (`movable`) and its receiver has room for the new need (the reservation changes there):
  // a removed device's stream ends once the receiver confirmed all of it, an added one starts at
  // its number (NUMBER); the other devices keep the connection and keep flowing meanwhile.
  // Otherwise (`before_reconnect` is called first, from this thread): finishes with the current
  // receiver (FIN/FIN_ACK, everything stored), schedules the new set (none: disconnect) and
  // connects; the sends of every device wait for that. When no receiver takes the new set, every
  // device is given back in `*removed` and nothing is sent through the platform.
  Status set_devices(const std::vector<uint16_t>& devices, const std::map<uint16_t, uint64_t>& next,
                     const PlatformNeed& need, std::map<uint16_t, uint64_t>* removed,
                     const std::function<void()>& before_reconnect = {});
  std::vector<uint16_t> devices() const;

  PlatformSenderStats stats() const;

  struct Impl;

 private:
  explicit PlatformSender(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace slotstream
