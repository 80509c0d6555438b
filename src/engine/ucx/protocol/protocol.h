// The interface every flow-control protocol implements, and the registry that lists them.
//
// A protocol decides *where* in the receiver the sender's data goes and how the two sides agree
// that receiver memory is free again. It does not know about devices, fragments, files or which
// UCX transport is underneath: the stream layer (src/engine/ucx/stream) and the fabric (src/engine/ucx/fabric) do.
//
//   set-up:   receiver make_receiver -> setup() bytes (ACCEPT) -> sender make_sender(those bytes)
//             -> sender setup() bytes (SETUP) -> receiver connect(those bytes [, endpoint back])
//   sender:   transmit_st(record) for each filled local block, in ring order; idle_st() when
//             nothing is waiting; finish_st() once at the end
//   receiver: poll(records) -> the stream layer consumes each record -> release(id)
//
// What the sender hands to transmit_st is one *unit*, at most one block: a record (a 16-byte
// block header and its payload), or several records behind a packed header when the stream layer
// packed small messages (wire/block_header.h, engine/ucx/stream/send_ring.h). Block protocols put
// each unit in a block of its own (status_byte, sliding_window, credit); ring protocols pack units
// back to back (packed_ring, buffered_read). Every record keeps its header, so device, packet
// number and length survive any packing; the receiver's stream layer unpacks (engine/ucx/stream/delivery.h).
//
// Packing is the stream layer's, not a protocol's: every protocol takes the option `pack=on|off`
// beside its own (packs(), protocol_options()); Descriptor::packs says which default it has.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/ucx/fabric/fabric.h"
#include "engine/ucx/protocol/options.h"
#include "slotstream/status.h"

namespace slotstream::protocol {

struct Geometry {
  uint32_t blocks = 0;
  uint32_t block_size = 0;  // bytes, header included
  uint64_t bytes() const { return uint64_t(blocks) * block_size; }
};

// What a sender-side protocol works with. Owned by the Sender; valid for the protocol's life.
struct SenderFabric {
  fabric::Context& context;
  fabric::Worker& worker;
  fabric::Endpoint& endpoint;
  Geometry geometry;
  fabric::Liveness alive;  // consulted inside every blocking wait
  // Where `endpoint` leads (the receiver's worker address from ACCEPT, and the host the control
  // connection reached): for a protocol that opens a second connection to the same receiver worker
  // from a worker of its own (sliding_window:ack=thread, its ACK thread's completion queue).
  std::vector<uint8_t> peer_address = {};
  std::string peer_host = {};
};

// What a receiver-side protocol works with, for one connected sender.
struct ReceiverFabric {
  fabric::Context& context;
  fabric::Worker& worker;  // shared by every sender of this transport (MULTI-threaded)
  Geometry geometry;
};

// The sender's half of the set-up (SETUP). `endpoint` reaches the sender's worker; it is set only
// for protocols that ask for it (Descriptor::receiver_endpoint) and outlives the protocol.
struct PeerSetup {
  fabric::Endpoint* endpoint = nullptr;
  std::span<const uint8_t> setup;
};

// One unit of received data: a block header and its payload, at the start of `bytes`. `bytes` is
// the receiver memory the record holds until it is released — block protocols hand out the whole
// block, ring protocols exactly the record — which is what buffer utilisation measures. `id`
// names it to release(); `slot` is the receiver block it lies in (block protocols: its index;
// ring protocols: its offset / block size), for holds and tests.
struct Record {
  uint64_t id = 0;
  uint32_t slot = 0;
  std::span<const std::byte> bytes;
};

inline constexpr size_t kMaxSamples = 1 << 20;

// What a protocol did, reported through the interface (benchmark, `send --json`). The common
// fields mean the same for every protocol, so that a comparison compares like with like.
struct ProtocolStats {
  uint64_t records = 0;     // sender: records transmitted
  uint64_t sync_ops = 0;    // synchronisation operations: status reads, ACKs, credit updates...
  uint64_t held_skips = 0;  // sender: receiver blocks skipped because they were held
  // Sender: times transmit_st found no free receiver space and waited, and for how long in all
  // (fence, reads, polling and back-off included) — the paper's synchronisation-control latency,
  // measured the same way for every protocol.
  uint64_t waits = 0;
  uint64_t wait_ns = 0;
  std::vector<uint64_t> wait_samples_ns;     // one per wait (at most kMaxSamples)
  std::vector<uint64_t> sync_op_samples_ns;  // one per synchronisation operation: what it costs
  std::map<std::string, uint64_t> counters;  // the protocol's own, by name (documented where counted)
};

// Measures the sender's waits for receiver space the one way every protocol uses:
//   if (no space) { WaitTimer w(stats_); ...wait... }
class WaitTimer {
 public:
  explicit WaitTimer(ProtocolStats& stats) : stats_(stats), t0_(std::chrono::steady_clock::now()) {}
  ~WaitTimer();
  WaitTimer(const WaitTimer&) = delete;
  WaitTimer& operator=(const WaitTimer&) = delete;
  // The wait is not over here and goes on elsewhere (a filler hands it to the sending thread,
  // which times it again): record nothing.
  void dismiss() { dismissed_ = true; }

 private:
  ProtocolStats& stats_;
  std::chrono::steady_clock::time_point t0_;
  bool dismissed_ = false;
};

// Appends a sample unless `samples` already holds kMaxSamples.
void add_sample(std::vector<uint64_t>& samples, uint64_t ns);

// Threading: every method but setup() is called by one thread at a time (suffix _st): whoever
// holds the lane's transmit token — a filler that just committed a block, or the lane's sending
// thread (engine/ucx/stream/send_ring.h); the token orders them. make_sender and setup() run on the
// connecting thread before any of them.
class SenderProtocol {
 public:
  virtual ~SenderProtocol() = default;
  // Bytes the receiver needs to reach into this sender (sent in SETUP; most protocols: none).
  virtual std::vector<uint8_t> setup() const { return {}; }
  // Moves the `length`-byte unit at `src` (a local send block) into receiver memory and makes
  // it visible there. May block for receiver space. If the data transfer is still running on
  // return, `*data_req` holds it and `src` must stay untouched until it completes.
  virtual Status transmit_st(const std::byte* src, size_t length, fabric::Request* data_req) = 0;
  // Whether transmit_st would place a unit now without waiting for receiver space, looking once if
  // it must (status_byte: one status read when its cache has no free block). A filler that
  // transmits asks before each unit and leaves the lane to the sending thread when there is none,
  // going back to filling (the lane is busy: records pack meanwhile). Default: always.
  virtual Status space_st(bool* ready) {
    *ready = true;
    return Status::ok();
  }
  // Waits until transmit_st would not wait for receiver space; the sending thread calls it before
  // it seals the open block, so that what arrives meanwhile leaves with it. Protocols whose
  // transmit_st waits by itself need not override it. Counted as a wait (WaitTimer) like one.
  virtual Status wait_space_st() { return Status::ok(); }
  // Nothing is waiting to be transmitted right now (the sending thread polls about every ms while
  // idle, more often while data flows). Protocols that coalesce or expect credits act here.
  virtual Status idle_st() { return Status::ok(); }
  // Whether records taken by transmit_st are held back (coalesced, queued) and idle_st() acts on
  // them: the sending thread then calls idle_st() again within ~50 µs instead of after its ~1 ms
  // idle period (a progress engine that runs while the application does something else).
  virtual bool holding_st() const { return false; }
  // Called once after the last transmit: everything must be remotely complete on return.
  virtual Status finish_st() = 0;
  // Everything, samples included: after the sending thread has ended.
  virtual ProtocolStats stats() const = 0;
  // Cheap, for progress displays while sending (stats().held_skips).
  virtual uint64_t held_skips_st() const { return 0; }
};

// How a sender waits for the receiver (free blocks, ACKs): spin for the first polls — the
// common case is a receiver that frees a block within microseconds — then sleep, longer each
// time up to 200 µs; a wait that has lasted that long already (about 20 ms: a receiver that is
// stalled — a full disk, a stopped process) backs off further, to 2 ms, so that it does not cost
// a core. Every protocol uses the same policy, so none is favoured in a comparison.
class PollBackoff {
 public:
  void pause();
  // The same policy, but the sleeps are spent in `worker`'s event wait (a worker created with a
  // wake-up fd, Descriptor::sender_wakeup): an operation of the peer that reaches this worker
  // (tcp: a receiver's get or put) ends the sleep at once and is answered.
  void pause(fabric::Worker& worker);
  // For polls that are a read through the peer: `poll_cost` is the typical time one took
  // (fabric::Worker::typical_completion). Short (shm, rdma: the NIC or CPU answers), pause().
  // A round trip through the peer's thread (fabric::wait_policy::kPeerRoundTrip or more: tcp)
  // is not spun on — back to back such reads keep a core and the peer's thread busy answering
  // "nothing yet" — : sleep in `worker`'s event wait about as long as one read takes before the
  // next (round_trip_sleep), so that reading costs at most about half the wait.
  void pause(fabric::Worker& worker, std::chrono::nanoseconds poll_cost);
  // The sleep before the next of `polls` reads that each took `poll_cost` (pure).
  static std::chrono::microseconds round_trip_sleep(uint32_t polls, std::chrono::nanoseconds poll_cost);
  void reset() { polls_ = 0; }

 private:
  uint32_t polls_ = 0;
};

// Threading: one thread at a time per connected sender: its session thread runs make_receiver,
// connect and the destructor; the consumer loop (poll, release, progress, wait, ...) runs on that
// thread too, or, with ReceiverOptions::round_robin, on the receiver's one round-robin consumer
// thread (handed over under a mutex: never two threads at once).
class ReceiverProtocol {
 public:
  virtual ~ReceiverProtocol() = default;
  // Bytes the sender needs to find and reach this receiver's memory (sent in ACCEPT).
  virtual std::vector<uint8_t> setup() const = 0;
  // The sender's SETUP. Protocols without a sender half accept only an empty one.
  virtual Status connect(const PeerSetup& peer);
  // Appends every record that is complete and not yet released.
  virtual void poll(std::vector<Record>* out) = 0;
  // The receiver is done with record `id`; its memory may be reused by the sender.
  virtual void release(uint64_t id) = 0;
  // Marks receiver block `slot` unavailable (paper status 2) or available again. Only called
  // when Descriptor::holds.
  virtual void set_hold(uint32_t /*slot*/, bool /*held*/) {}
  // Zero-copy receive (paper §3.3: "the receiver might need to retain data within a memory
  // block"): instead of release(id), record `id` stays where it is, unavailable to the sender
  // (status 2), until release_retained(id). Only called when Descriptor::holds. retain() is the
  // consumer's; release_retained() may come from any thread, also after the session ended (the
  // protocol then outlives its session: it must not need its worker for it).
  virtual void retain(uint64_t /*id*/) {}
  virtual void release_retained(uint64_t /*id*/) {}
  // Called on every pass of the consumer loop, before poll(): protocols whose notifications
  // arrive through the UCX worker progress it here (the receiver polling its own completion
  // queue). Returns whether it found work.
  virtual bool progress() { return false; }
  // The consumer found nothing to do: wait up to `max` (default: sleep). A protocol that is
  // notified of new data may return as soon as it is.
  virtual void wait(std::chrono::microseconds max);
  // Most records that can be unreleased at once (the stream layer's reorder window).
  virtual uint64_t max_records() const = 0;
  virtual ProtocolStats stats() const { return {}; }
};

struct Descriptor {
  std::string_view name;
  std::string_view summary;
  // The options it takes, for --help: "key=VALUE: meaning; key2=...". Empty: none.
  std::string_view options_help;
  // The receiver takes part in transfers even where RMA itself is one-sided (two-sided
  // notifications or ACKs, gets it issues): its session gets a UCX worker of its own, progressed
  // only by the consumer (progress(), wait()).
  bool receiver_progress = false;
  // Devices cannot share a connection (the paper's sliding window, §2.3): the sender opens one
  // connection per device.
  bool connection_per_device = false;
  // A benchmark reference that moves bytes but delivers no messages (ucx_raw_put): not offered
  // by `slotstream send`, and its receiver confirms FIN without counting messages.
  bool reference = false;
  // The receiver can hold individual blocks (paper status 2): set_hold, retain and
  // release_retained work, so it can also lend blocks to the application in place (zero-copy
  // receive). Without it, the receiver applies back-pressure by leaving records unprocessed.
  bool holds = false;
  // The receiver reaches into the sender's memory: it gets an endpoint to the sender's worker
  // with the SETUP, and the sender's worker must answer (on tcp: the sending thread progresses
  // it while idle, and after FIN until the receiver has let go and closed the connection).
  bool receiver_endpoint = false;
  // The idle sending thread sleeps on the worker's wake-up file descriptor (every sender's
  // worker has one), woken by a filler's commit or by anything that reaches the worker: a peer's
  // operation that needs this worker is answered at once. (Without it the idle sending thread
  // naps, and a filler's commit transmits from the filler without a hand-off.)
  bool sender_wakeup = false;
  // The stream layer packs small records into a unit by default (pack=on|off overrides it).
  bool packs = false;
  // Rejects options the protocol does not take (nullptr: it takes none). Never sees `pack`.
  Status (*check_options)(const Options& options) = nullptr;
  Status (*make_sender)(SenderFabric& fabric, std::span<const uint8_t> setup, const Options& options,
                        std::unique_ptr<SenderProtocol>* out) = nullptr;
  Status (*make_receiver)(ReceiverFabric& fabric, const Options& options,
                          std::unique_ptr<ReceiverProtocol>* out) = nullptr;
};

// The set-up the block protocols' receivers send (status_byte, sliding_window, ucx_raw_put): `words`
// u64 words (addresses, a session id), then their region's packed remote key, little-endian; unpacked
// for `endpoint`. Anything else is a kProtocolError naming `protocol`.
Status read_keyed_setup(std::span<const uint8_t> setup, std::string_view protocol, fabric::Endpoint& endpoint,
                        std::span<uint64_t> words, std::unique_ptr<fabric::RemoteKey>* rkey);

// The registry: every protocol this build has, in a fixed order.
std::span<const Descriptor* const> all();
const Descriptor* find(std::string_view name);
// The registry as the public ProtocolInfo (engine "ucx"): what slotstream::protocols() lists first.
std::vector<ProtocolInfo> infos(bool with_references);
// `options` against the protocol's check_options (none allowed without one), `pack` against the
// stream layer's rule.
Status check_options(const Descriptor& d, const Options& options);
// Whether the sender packs small records (Descriptor::packs unless `pack=` says otherwise).
Status packs(const Descriptor& d, const Options& options, bool* out);
// The options without the stream layer's (`pack`): what make_sender / make_receiver get.
Options protocol_options(const Options& options);
inline constexpr std::string_view kPackHelp =
    "pack=on|off: small messages share a block while the lane is busy (every protocol; default: on for status_byte)";

}  // namespace slotstream::protocol
