// One slotstream receiver per listen address in a process, shared by every slotstreamsrc of that address:
// it routes each sender's devices to the src that asked for them. Plain C++ on the public API; no GStreamer
// type appears here (the src supplies the memory a payload is copied into).
//
// Routing: a src asks for (sender, device), or for (any sender, device) — the first sender whose message of
// that device arrives is then bound to it until the stream ends. A message nobody asked for, or for a src
// whose queue is full, waits in its receive block: the sink answers kBusy, the receiver pauses that device
// (its sender waits, up to its max-wait) and offers it again 100 ms later. Nothing is dropped. Blocks lent to
// srcs may hold all of a sender's blocks: then the sender waits for a free block — back-pressure again, never
// loss.
//
// Zero-copy (MessageView, slotstream/slotstream.h): the receiver lends each sender's messages in place. A buffer
// message for a src that lends (zero-copy auto or on) reaches it as the view itself — its receive block held with
// status 2 until the src's GstMemory over it is freed, the sender writing other blocks meanwhile. A src with zero-copy
// off, and every sender whose protocol cannot hold blocks (only status_byte can), take the copy path: the
// payload is copied once, from the receive block into memory the src's PayloadFactory gives (a GstBuffer's),
// and the block is given back at once. Each stream starts with a note saying which path it takes and why.
// See docs/gstreamer.md, "Zero-copy".
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "frame.h"
#include "slotstream/slotstream.h"

namespace slotstream::gst {

// Memory a buffer's payload is received into, owned by the src once delivered.
class Payload {
 public:
  virtual ~Payload() = default;
  virtual std::span<std::byte> bytes() = 0;
};
// Null when there is no memory.
using PayloadFactory = std::function<std::unique_ptr<Payload>(uint64_t length)>;

// A src's zero-copy property: lend where the sender's protocol can (auto), insist (on: a sender that cannot
// lend ends the stream with an error), or always copy (off).
enum class ZeroCopy { kAuto, kOn, kOff };

// What a src takes from its outlet, in stream order.
struct Delivery {
  enum class Kind { kNote, kCaps, kBuffer, kEos, kError } kind = Kind::kEos;
  std::string caps;                  // kCaps
  BufferHeader buffer;               // kBuffer
  std::unique_ptr<Payload> payload;  // kBuffer, copied: its payload (null when empty)
  MessageView view;                  // kBuffer, lent: the message, holding its receive block while it lives
  std::span<const std::byte> lent;   // kBuffer, lent: where the payload lies in view
  Status error;                      // kError: why the stream cannot go on (lost sender, foreign message)
  bool zero_copy = false;            // kNote: whether buffers come lent in place from now on
  std::string note;                  // kNote: how the stream is received, and why
  std::string sender;                // the sender it came from
};

// One slotstreamsrc's end of the receiver: a bounded queue of deliveries. Threading: pop/set_flushing from
// the src's threads; the rest from the receiver's threads, through the hub.
class Outlet {
 public:
  // sender: "" for any; capacity: buffers queued before the device is paused (lent ones hold their blocks).
  Outlet(std::string sender, uint16_t device, size_t capacity, PayloadFactory factory,
         ZeroCopy zero_copy = ZeroCopy::kAuto);
  // The next delivery; kCancelled while flushing (set_flushing(true) wakes a waiting pop).
  Status pop(Delivery* out);
  void set_flushing(bool flushing);

  uint16_t device() const { return device_; }
  const std::string& wanted_sender() const { return wanted_; }
  ZeroCopy zero_copy() const { return zero_copy_; }
  // Memory for a copied payload (the src's factory). The receiver's threads.
  std::unique_ptr<Payload> allocate(uint64_t length) const { return factory_(length); }

 private:
  friend class ReceiverHub;
  friend class SenderRoutes;
  // Whether it can take a buffer, waiting up to `wait` for the src to pop one (false while flushing).
  bool has_room(std::chrono::milliseconds wait);
  void push(Delivery d);
  // Whether `sender` feeds it for the first time (its note is due).
  bool first_from(const std::string& sender);

  const std::string wanted_;
  const uint16_t device_;
  const size_t capacity_;
  const PayloadFactory factory_;
  const ZeroCopy zero_copy_;
  // Routing state: guarded by the hub's mutex.
  std::string bound_;   // the sender feeding it ("" until one is)
  bool ended_ = false;  // end of stream or an error was queued: no more routing to it

  std::mutex mutex_;
  std::condition_variable cv_;       // a delivery queued, or flushing
  std::condition_variable room_cv_;  // a buffer popped from a full queue, or flushing
  std::deque<Delivery> queue_;
  size_t buffers_ = 0;  // kBuffer deliveries in queue_
  bool flushing_ = false;
  std::string noted_;  // the sender whose note was pushed
};

class ReceiverHub {
 public:
  // Attaches `outlet` to the receiver listening on `listen` ("HOST:PORT"; port 0: a free one, shared by
  // every src given the same text), starting it if this process has none there, for `transport` (auto:
  // shm, tcp, rdma; udp: the datagram transport). Fails when another src already has the same (sender,
  // device) there, when the tokens or transports differ, or when the address cannot be bound.
  static Status attach(const std::string& listen, const std::string& token, std::shared_ptr<Outlet> outlet,
                       std::shared_ptr<ReceiverHub>* out, Transport transport = Transport::kAuto);
  ~ReceiverHub();
  void detach(const std::shared_ptr<Outlet>& outlet);
  // Where it listens (the real port when 0 was asked).
  std::string address() const;

  // Where warnings go (unclaimed devices, refused senders); set once by the plugin.
  static void set_log(std::function<void(const std::string&)> log);

 private:
  friend class SenderRoutes;
  ReceiverHub(std::string listen, std::string token, Transport transport)
      : listen_(std::move(listen)),
        token_(std::move(token)),
        transport_(transport) {}
  Status start();
  // The outlet that takes (sender, device) now, binding an any-sender one; null if none.
  std::shared_ptr<Outlet> route(const std::string& sender, uint16_t device);
  void mark_ended(Outlet& outlet);
  // Every device of `sender` sent its end of stream: its connection finishes next.
  void session_closing(const std::string& sender);
  void session_ended(const SessionReport& report);
  static void log(const std::string& text);

  const std::string listen_;
  const std::string token_;
  const Transport transport_;
  std::unique_ptr<Receiver> receiver_;
  // How long the last src's stop waits for finishing senders (their FIN) before the receiver stops.
  static constexpr std::chrono::milliseconds kClosingGrace{2000};

  std::mutex mutex_;  // guards outlets_, closing_ and every outlet's routing state
  std::vector<std::shared_ptr<Outlet>> outlets_;
  std::set<std::string> closing_;  // senders between their last end of stream and their session's end
  std::condition_variable closing_cv_;
};

}  // namespace slotstream::gst
