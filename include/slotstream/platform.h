// slotstream on the cloud-edge management platform (status-byte paper §3.1, Fig. 2), whose state
// lives in etcd: receivers register what they have free; a sender asks for a receiver with the
// resources it needs, gets one reserved atomically, and keeps streaming when that receiver dies —
// the platform gives it another and every message not confirmed stored is sent again, under the
// same numbers (docs/platform.md).
//
//   PlatformSender: connect -> send(device, ...) per filler thread -> finish()
//   PlatformRegistration: start(receiver, ...) -> lost()? -> destroy (the record goes at once)
//   read_platform_state: what the platform holds (`slotstream platform`)
//   OffloadPolicy, decide_offload, CpuMeter: the edge's decisions (`slotstream edge`; slotstream/edge.h's
//   EdgeServer carries them out)
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
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
// kInvalidArgument for a need the platform does not take ("cpu -100: must be 0..1048576"): negative,
// not finite, or beyond the platform's most.
Status check_platform_need(const PlatformNeed& need);

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

// ------------------------------------------------------------------------ the receiver's side

// What a receiver offers platform senders; an unset dimension is not limited. Its receive memory is
// its Receiver's budget (ReceiverOptions::max_memory).
struct PlatformCapacity {
  std::optional<double> cpu;        // CPU cores for processing (PlatformRegistration: unset is the online CPUs)
  std::optional<double> bandwidth;  // bytes/s
  std::optional<double> fps;        // messages/s
};

struct PlatformReceiverOptions {
  std::string platform;  // etcd://HOST:PORT[,HOST:PORT...]
  PlatformSecurity security;
  // HOST:PORT senders reach the receiver at. Empty: its listen address, a wildcard host (0.0.0.0, ::)
  // replaced by this host's name.
  std::string address;
  std::string name;  // its name on the platform (1-64 of [A-Za-z0-9._:-]); empty: the address
  // What the receiver was started with (ReceiverOptions::transport and rdma): it serves that transport,
  // or under kAuto shm and tcp, and rdma where this host has a usable RDMA device.
  Transport transport = Transport::kAuto;
  RdmaOptions rdma;
  PlatformCapacity capacity;
  int64_t lease_ttl_seconds = 5;  // a dead receiver's record lasts this long
  // Bytes waiting for the receiver's workers (DirectoryWorkers::total_backlog_bytes), published with the
  // rest of what it measures about every second; empty: 0. Called from the registration's thread.
  std::function<uint64_t()> backlog_bytes;
  // Registration, renewals, a record made again (any thread; may be empty).
  std::function<void(const std::string&)> on_event;
  // Another receiver took the name while this one's record had lapsed: called once, from the
  // registration's thread. The receiver should stop (its senders then move on); lost() says so too.
  std::function<void(const std::string&)> on_lost;
};

// A receiver on the platform: its record, held by a lease the registration keeps alive and refreshed
// with what it measures about every second (free CPU, memory and receive memory, senders, backlog).
// The name is one receiver's at a time (docs/platform.md). Threading: any thread.
class PlatformRegistration {
 public:
  // Registers the started `receiver`, which must outlive the registration. kInvalidArgument: options
  // that are not usable (the platform's address, an address, a name, a capacity); kRefused: a name another
  // live receiver holds.
  static Status start(const Receiver& receiver, PlatformReceiverOptions options,
                      std::unique_ptr<PlatformRegistration>* out);
  ~PlatformRegistration();  // removes the record at once: no sender is scheduled here any more
  bool lost() const;        // another receiver took the name (on_lost was called)
  const std::string& name() const;
  const std::string& address() const;

  struct Impl;

 private:
  explicit PlatformRegistration(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// ------------------------------------------------------------------------ what the platform holds

struct PlatformReceiverState {
  std::string name;
  std::string address;
  double free_cpu = 0;  // idle cores
  uint64_t free_memory = 0;
  uint64_t free_receive_memory = 0;
  uint32_t senders = 0;
  std::string json;  // the record as stored (docs/platform.md)
};

struct PlatformReservationState {
  std::string sender;
  std::string receiver;
  std::string amount;  // "cpu 1.5, 46.1 MB/s, 300 fps, 32.0 MiB"
  std::string json;    // the reservation as stored
};

struct PlatformState {
  int64_t revision = 0;  // etcd's, of the reading
  std::vector<PlatformReceiverState> receivers;
  std::vector<PlatformReservationState> reservations;
  std::vector<std::string> skipped;  // records no live process wrote, each with why (left out above)
};

// One consistent reading of the platform. kInvalidArgument: `platform` or `security` is not usable;
// other codes: etcd could not be read (the message says what to do).
Status read_platform_state(const std::string& platform, const PlatformSecurity& security, PlatformState* out);

// ------------------------------------------------------------------------ the edge's decisions

// When an edge server moves one device's processing to a receiver the platform schedules, and takes one
// back (status-byte paper §3.1: a server whose processing needs exceed its capacity asks for resources).
// Hysteresis: offload above `above`, take back below `below` (< above), nothing in between, at most one
// move per `settle` (the load needs time to show what the last move did).
struct OffloadPolicy {
  double above = 80;
  double below = 50;
  std::chrono::milliseconds settle{2000};
};
// kInvalidArgument unless below < above and settle >= 0.
Status check_offload_policy(const OffloadPolicy& p);

enum class OffloadMove { kNone, kOffload, kTakeBack };
// One device per move: the caller offloads its highest-numbered local device, and takes back the one it
// offloaded last. `since_last_move`: time since the last move (or attempt); nullopt before the first.
OffloadMove decide_offload(const OffloadPolicy& p, double load, size_t local_devices, size_t offloaded_devices,
                           std::optional<std::chrono::steady_clock::duration> since_last_move);

// Idle and busy CPU time of this host between calls (/proc/stat). Threading: one thread at a time.
class CpuMeter {
 public:
  CpuMeter();
  struct Reading {
    double busy = 0;        // the busy fraction of all CPUs, 0..1
    double idle_cores = 0;  // the busy fraction's complement times the online CPUs
  };
  // Since the last call (or construction).
  Reading read();

 private:
  uint64_t busy_ = 0, total_ = 0;
};

}  // namespace slotstream
