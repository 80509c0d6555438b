// slotstreamsrc: one device of one sender, received by the process's receiver for its listen address
// (shared_receiver.h), pushed as one buffer per message with the sender's caps and timestamps.
//
// Zero-copy (zero-copy=auto, the default, with a status_byte sender): a buffer's memory is its receive block
// itself, a read-only GstMemory over the MessageView that holds the block (status 2) until downstream frees the
// buffer. Copy path (zero-copy=off, or a sender whose protocol cannot lend blocks): each payload is copied once
// into a pooled GstBuffer (BufferPayload) and the block is released at once. See docs/gstreamer.md, "Zero-copy".
#include <memory>
#include <mutex>
#include <string>

#include "elements.h"
#include "lent_memory.h"
#include "shared_receiver.h"

GST_DEBUG_CATEGORY_STATIC(slotstream_src_debug);
#define GST_CAT_DEFAULT slotstream_src_debug

using namespace slotstream;
using namespace slotstream::gst;

namespace {

enum {
  PROP_0,
  PROP_LISTEN,
  PROP_SENDER,
  PROP_DEVICE,
  PROP_TOKEN_FILE,
  PROP_MAX_BUFFERS,
  PROP_ZERO_COPY,
  PROP_STATS,
  PROP_TRANSPORT,
};

constexpr const char* kDefaultListen = "0.0.0.0:7000";
constexpr guint kDefaultMaxBuffers = 4;
// Buffer flags that describe the data; the rest of the word is the buffer object's own state.
constexpr guint32 kCarriedFlags = ~guint32(GST_MINI_OBJECT_FLAG_LAST - 1) & ~guint32(GST_BUFFER_FLAG_TAG_MEMORY);

struct Settings {
  std::string listen = kDefaultListen;
  std::string sender;  // "": any sender
  guint device = 0;
  std::string token_file;
  guint max_buffers = kDefaultMaxBuffers;
  ZeroCopy zero_copy = ZeroCopy::kAuto;
  Transport transport = Transport::kAuto;
};

// Buffers pushed since start, by how they were made (the stats property; the slotstream-stats message at EOS).
struct Counters {
  guint64 lent = 0;    // the receive block itself (zero-copy)
  guint64 copied = 0;  // copied once (by this src, or by the receiver: a message that spanned blocks)
};

struct Running {
  std::shared_ptr<ReceiverHub> hub;
  std::shared_ptr<Outlet> outlet;
  GstCaps* caps = nullptr;  // the stream's caps (owned)
  bool offset_set = false;  // the pad offset that lines the sender's timestamps up with our running time
};

// The copy path's buffers come from a pool of the stream's buffer size: a fresh allocation of a frame per buffer
// cost page faults and zeroing (12 % of the receiving process's CPU for 12 cameras, perf). Any thread.
class BufferPool {
 public:
  ~BufferPool() { reset(); }
  GstBuffer* acquire(uint64_t size) {
    std::lock_guard lock(mutex_);
    if (size != size_ || !pool_) {
      reset();
      size_ = size;
      if (size > 0 && size <= G_MAXUINT) pool_ = make(guint(size));
    }
    GstBuffer* buffer = nullptr;
    if (pool_ && gst_buffer_pool_acquire_buffer(pool_, &buffer, nullptr) == GST_FLOW_OK) return buffer;
    return gst_buffer_new_allocate(nullptr, size, nullptr);
  }

 private:
  static GstBufferPool* make(guint size) {
    GstBufferPool* pool = gst_buffer_pool_new();
    GstStructure* config = gst_buffer_pool_get_config(pool);
    gst_buffer_pool_config_set_params(config, nullptr, size, 0, 0);  // no limit: max-buffers bounds the queue
    if (gst_buffer_pool_set_config(pool, config) && gst_buffer_pool_set_active(pool, TRUE)) return pool;
    gst_object_unref(pool);
    return nullptr;
  }
  void reset() {
    if (!pool_) return;
    gst_buffer_pool_set_active(pool_, FALSE);  // buffers still downstream are freed when they come back
    gst_object_unref(pool_);
    pool_ = nullptr;
  }
  std::mutex mutex_;
  GstBufferPool* pool_ = nullptr;
  uint64_t size_ = 0;
};

// The copy path's payload: a GstBuffer of its own, mapped for writing while the message is copied in.
class BufferPayload : public Payload {
 public:
  BufferPayload(BufferPool& pool, uint64_t length) : buffer_(pool.acquire(length)) {
    mapped_ = buffer_ && gst_buffer_map(buffer_, &map_, GST_MAP_WRITE);
  }
  ~BufferPayload() override {
    if (mapped_) gst_buffer_unmap(buffer_, &map_);
    if (buffer_) gst_buffer_unref(buffer_);
  }
  std::span<std::byte> bytes() override {
    if (!mapped_) return {};
    return {reinterpret_cast<std::byte*>(map_.data), map_.size};
  }
  GstBuffer* take() {
    if (mapped_) gst_buffer_unmap(buffer_, &map_);
    mapped_ = false;
    return std::exchange(buffer_, nullptr);
  }

 private:
  GstBuffer* buffer_;
  GstMapInfo map_{};
  bool mapped_ = false;
};

}  // namespace

struct _GstSlotstreamSrc {
  GstPushSrc parent;
  Settings* settings;  // guarded by the object lock
  Running* running;
  Counters* counters;  // guarded by the object lock
};

G_DEFINE_TYPE(GstSlotstreamSrc, gst_slotstream_src, GST_TYPE_PUSH_SRC)

namespace {

GstStaticPadTemplate src_template = GST_STATIC_PAD_TEMPLATE("src", GST_PAD_SRC, GST_PAD_ALWAYS, GST_STATIC_CAPS_ANY);

void set_property(GObject* object, guint id, const GValue* value, GParamSpec* pspec) {
  auto* self = GST_SLOTSTREAM_SRC(object);
  GST_OBJECT_LOCK(self);
  Settings& s = *self->settings;
  auto str = [&] { return std::string(g_value_get_string(value) ? g_value_get_string(value) : ""); };
  switch (id) {
    case PROP_LISTEN:
      s.listen = str();
      break;
    case PROP_SENDER:
      s.sender = str();
      break;
    case PROP_DEVICE:
      s.device = g_value_get_uint(value);
      break;
    case PROP_TOKEN_FILE:
      s.token_file = str();
      break;
    case PROP_MAX_BUFFERS:
      s.max_buffers = g_value_get_uint(value);
      break;
    case PROP_ZERO_COPY:
      s.zero_copy = ZeroCopy(g_value_get_enum(value));
      break;
    case PROP_TRANSPORT:
      s.transport = Transport(g_value_get_enum(value));
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec);
      break;
  }
  GST_OBJECT_UNLOCK(self);
}

// Object lock held.
GstStructure* stats_locked(GstSlotstreamSrc* self) {
  return gst_structure_new("slotstream-stats", "lent", G_TYPE_UINT64, self->counters->lent, "copied", G_TYPE_UINT64,
                           self->counters->copied, nullptr);
}

void get_property(GObject* object, guint id, GValue* value, GParamSpec* pspec) {
  auto* self = GST_SLOTSTREAM_SRC(object);
  GST_OBJECT_LOCK(self);
  const Settings& s = *self->settings;
  auto str = [](const std::string& v) { return v.empty() ? nullptr : v.c_str(); };
  switch (id) {
    case PROP_LISTEN:
      g_value_set_string(value, s.listen.c_str());
      break;
    case PROP_SENDER:
      g_value_set_string(value, str(s.sender));
      break;
    case PROP_DEVICE:
      g_value_set_uint(value, s.device);
      break;
    case PROP_TOKEN_FILE:
      g_value_set_string(value, str(s.token_file));
      break;
    case PROP_MAX_BUFFERS:
      g_value_set_uint(value, s.max_buffers);
      break;
    case PROP_ZERO_COPY:
      g_value_set_enum(value, gint(s.zero_copy));
      break;
    case PROP_TRANSPORT:
      g_value_set_enum(value, gint(s.transport));
      break;
    case PROP_STATS:
      g_value_take_boxed(value, stats_locked(self));
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec);
      break;
  }
  GST_OBJECT_UNLOCK(self);
}

Status check(const Settings& s, std::string* token) {
  if (!s.sender.empty()) {
    if (auto why = invalid_sender_name(s.sender)) return {Code::kInvalidArgument, "sender: " + *why};
  }
  std::string host;
  uint16_t port = 0;
  if (Status st = parse_address(s.listen, &host, &port); !st.is_ok()) return {st.code(), "listen: " + st.message()};
  if (!s.token_file.empty()) {
    if (Status st = read_token_file(s.token_file, token); !st.is_ok())
      return {st.code(), "token-file: " + st.message()};
  }
  return Status::ok();
}

gboolean start(GstBaseSrc* base) {
  auto* self = GST_SLOTSTREAM_SRC(base);
  GST_OBJECT_LOCK(self);
  Settings s = *self->settings;
  GST_OBJECT_UNLOCK(self);
  std::string token;
  Running& r = *self->running;
  auto pool = std::make_shared<BufferPool>();  // the outlet's factory keeps it while the receiver may call it
  r.outlet = std::make_shared<Outlet>(
      s.sender, uint16_t(s.device), s.max_buffers,
      [pool](uint64_t length) { return std::make_unique<BufferPayload>(*pool, length); }, s.zero_copy);
  GST_OBJECT_LOCK(self);
  *self->counters = Counters{};
  GST_OBJECT_UNLOCK(self);
  Status st = check(s, &token);
  if (st.is_ok()) st = ReceiverHub::attach(s.listen, token, r.outlet, &r.hub, s.transport);
  if (!st.is_ok()) {
    r.outlet.reset();
    GST_ELEMENT_ERROR(self, RESOURCE, OPEN_READ, ("%s", st.message().c_str()), ("%s", detail(st).c_str()));
    return FALSE;
  }
  const std::string address = r.hub->address();
  GST_INFO_OBJECT(self, "device %u of %s, listening on %s", s.device,
                  s.sender.empty() ? "any sender" : s.sender.c_str(), address.c_str());
  // Where senders connect: the real port when listen asked for port 0 (`gst-launch-1.0 -m` prints it).
  gst_element_post_message(
      GST_ELEMENT(self),
      gst_message_new_element(GST_OBJECT(self),
                              gst_structure_new("slotstream-listening", "address", G_TYPE_STRING, address.c_str(),
                                                "device", G_TYPE_UINT, s.device, nullptr)));
  return TRUE;
}

gboolean stop(GstBaseSrc* base) {
  auto* self = GST_SLOTSTREAM_SRC(base);
  Running& r = *self->running;
  if (r.hub) r.hub->detach(r.outlet);
  if (r.caps) gst_caps_unref(r.caps);
  *self->running = Running{};  // the last src of an address stops its receiver here
  return TRUE;
}

// Caps come from the stream (its caps message); until then there is nothing to negotiate.
gboolean negotiate(GstBaseSrc* base) {
  auto* self = GST_SLOTSTREAM_SRC(base);
  return self->running->caps ? gst_base_src_set_caps(base, self->running->caps) : TRUE;
}

GstFlowReturn stream_error(GstSlotstreamSrc* self, const Status& st) {
  GST_ELEMENT_ERROR(self, RESOURCE, READ, ("%s", st.message().c_str()), ("%s", detail(st).c_str()));
  return GST_FLOW_ERROR;
}

GstFlowReturn take_caps(GstSlotstreamSrc* self, const std::string& text) {
  GstCaps* caps = gst_caps_from_string(text.c_str());
  if (!caps) return stream_error(self, {Code::kProtocolError, "the sender's caps cannot be parsed: " + text});
  Running& r = *self->running;
  if (!r.caps || !gst_caps_is_equal(r.caps, caps)) {
    if (r.caps) gst_caps_unref(r.caps);
    r.caps = gst_caps_ref(caps);
    if (!gst_base_src_set_caps(GST_BASE_SRC(self), caps)) {
      gst_caps_unref(caps);
      return GST_FLOW_NOT_NEGOTIATED;
    }
  }
  gst_caps_unref(caps);
  return GST_FLOW_OK;
}

// Buffers keep the sender's timestamps. So that downstream syncs to them, the pad's running-time offset
// maps the first buffer's pts to the moment it arrived (as if the sender's pipeline had started then).
void line_up_timestamps(GstSlotstreamSrc* self, GstClockTime pts) {
  Running& r = *self->running;
  if (r.offset_set || !GST_CLOCK_TIME_IS_VALID(pts) || gst_base_src_get_do_timestamp(GST_BASE_SRC(self))) return;
  r.offset_set = true;
  GstClock* clock = gst_element_get_clock(GST_ELEMENT(self));
  if (!clock) return;
  const GstClockTimeDiff running =
      GstClockTimeDiff(gst_clock_get_time(clock) - gst_element_get_base_time(GST_ELEMENT(self)));
  gst_object_unref(clock);
  gst_pad_set_offset(GST_BASE_SRC_PAD(self), running - GstClockTimeDiff(pts));
}

GstBuffer* make_buffer(GstSlotstreamSrc* self, Delivery& d) {
  const bool in_place = d.view && !d.view.copied();
  const bool copied = d.payload || (d.view && d.view.copied());
  GstBuffer* buf = d.view      ? wrap_lent(std::move(d.view), d.lent)
                   : d.payload ? static_cast<BufferPayload&>(*d.payload).take()
                               : gst_buffer_new();
  GST_OBJECT_LOCK(self);
  self->counters->lent += in_place;
  self->counters->copied += copied;
  GST_OBJECT_UNLOCK(self);
  const BufferHeader& h = d.buffer;
  GST_BUFFER_PTS(buf) = h.pts;
  GST_BUFFER_DTS(buf) = h.dts;
  GST_BUFFER_DURATION(buf) = h.duration;
  GST_BUFFER_OFFSET(buf) = h.offset;
  GST_BUFFER_OFFSET_END(buf) = h.offset_end;
  GST_BUFFER_FLAG_SET(buf, h.flags & kCarriedFlags);
  if (h.sent != kNone) {
    static GstCaps* sent_caps = gst_caps_new_empty_simple(kSentMetaCaps);  // lives as long as the process
    gst_buffer_add_reference_timestamp_meta(buf, sent_caps, h.sent, GST_CLOCK_TIME_NONE);
  }
  line_up_timestamps(self, h.pts);
  return buf;
}

// How the stream is received (zero-copy or why not), as a slotstream-receiving element message; a copy the user
// did not ask for (zero-copy not off) also as an INFO message, which gst-launch-1.0 prints.
void post_note(GstSlotstreamSrc* self, const Delivery& d) {
  GST_OBJECT_LOCK(self);
  const guint device = self->settings->device;
  const bool asked = self->settings->zero_copy != ZeroCopy::kOff;
  GST_OBJECT_UNLOCK(self);
  GST_INFO_OBJECT(self, "device %u of sender '%s': %s", device, d.sender.c_str(), d.note.c_str());
  gst_element_post_message(
      GST_ELEMENT(self),
      gst_message_new_element(GST_OBJECT(self), gst_structure_new("slotstream-receiving", "sender", G_TYPE_STRING,
                                                                  d.sender.c_str(), "device", G_TYPE_UINT, device,
                                                                  "zero-copy", G_TYPE_BOOLEAN, gboolean(d.zero_copy),
                                                                  "reason", G_TYPE_STRING, d.note.c_str(), nullptr)));
  if (asked && !d.zero_copy) {
    GST_ELEMENT_INFO(self, RESOURCE, READ, ("copying: %s", d.note.c_str()),
                     ("device %u of sender '%s' is copied, not lent: %s", device, d.sender.c_str(), d.note.c_str()));
  }
}

// What the stream's buffers were (lent in place, copied), as a slotstream-stats element message at its end.
void post_stats(GstSlotstreamSrc* self) {
  GST_OBJECT_LOCK(self);
  GstStructure* stats = stats_locked(self);
  GST_OBJECT_UNLOCK(self);
  gst_element_post_message(GST_ELEMENT(self), gst_message_new_element(GST_OBJECT(self), stats));
}

GstFlowReturn create(GstPushSrc* base, GstBuffer** out) {
  auto* self = GST_SLOTSTREAM_SRC(base);
  Running& r = *self->running;
  for (;;) {
    Delivery d;
    if (!r.outlet->pop(&d).is_ok()) return GST_FLOW_FLUSHING;
    switch (d.kind) {
      case Delivery::Kind::kNote:
        post_note(self, d);
        continue;
      case Delivery::Kind::kCaps:
        if (GstFlowReturn ret = take_caps(self, d.caps); ret != GST_FLOW_OK) return ret;
        continue;
      case Delivery::Kind::kBuffer:
        if (!r.caps)
          return stream_error(self, {Code::kProtocolError, "sender '" + d.sender + "' sent a buffer before its caps"});
        *out = make_buffer(self, d);
        return GST_FLOW_OK;
      case Delivery::Kind::kEos:
        GST_INFO_OBJECT(self, "end of stream from sender '%s'", d.sender.c_str());
        post_stats(self);
        return GST_FLOW_EOS;
      case Delivery::Kind::kError:
        return stream_error(self, d.error);
    }
  }
}

gboolean unlock(GstBaseSrc* base) {
  auto* self = GST_SLOTSTREAM_SRC(base);
  if (self->running->outlet) self->running->outlet->set_flushing(true);
  return TRUE;
}

gboolean unlock_stop(GstBaseSrc* base) {
  auto* self = GST_SLOTSTREAM_SRC(base);
  if (self->running->outlet) self->running->outlet->set_flushing(false);
  return TRUE;
}

void finalize(GObject* object) {
  auto* self = GST_SLOTSTREAM_SRC(object);
  if (self->running->caps) gst_caps_unref(self->running->caps);
  delete self->settings;
  delete self->running;
  delete self->counters;
  G_OBJECT_CLASS(gst_slotstream_src_parent_class)->finalize(object);
}

void install_properties(GObjectClass* oc) {
  const auto flags = GParamFlags(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_READY);
  g_object_class_install_property(
      oc, PROP_LISTEN,
      g_param_spec_string(
          "listen", "Listen",
          "HOST:PORT senders connect to (port 0: a free one, announced in a slotstream-listening element "
          "message); every slotstreamsrc of one listen text in this process shares one receiver",
          kDefaultListen, flags));
  g_object_class_install_property(
      oc, PROP_SENDER,
      g_param_spec_string("sender", "Sender",
                          "sender-name whose device this src takes; unset: the first sender that sends this device "
                          "(until its stream ends)",
                          nullptr, flags));
  g_object_class_install_property(
      oc, PROP_DEVICE,
      g_param_spec_uint("device", "Device", "device number of the stream to take", 0, 65535, 0, flags));
  g_object_class_install_property(
      oc, PROP_TOKEN_FILE,
      g_param_spec_string("token-file", "Token file",
                          "file holding the shared secret senders must prove they know; the srcs of one listen "
                          "address must agree",
                          nullptr, flags));
  g_object_class_install_property(
      oc, PROP_MAX_BUFFERS,
      g_param_spec_uint("max-buffers", "Maximum buffers",
                        "buffers received but not yet pushed before the device is paused (back-pressure to the sender: "
                        "nothing is dropped)",
                        1, 1024, kDefaultMaxBuffers, flags));
  g_object_class_install_property(
      oc, PROP_ZERO_COPY,
      g_param_spec_enum(
          "zero-copy", "Zero-copy",
          "auto: a buffer's memory is its receive block itself (read-only), held (status 2) while downstream keeps "
          "the buffer, where the sender's protocol can lend blocks (status_byte), else copied once; on: a sender that "
          "cannot lend is an error; off: copy once. Each stream says which in a slotstream-receiving element message. "
          "Lent buffers may hold all the sender's blocks: downstream keeping that many buffers pauses the sender "
          "(nothing is lost; its max-wait applies); raise the slotstreamsink's blocks for deep queues",
          GST_TYPE_SLOTSTREAM_ZERO_COPY, gint(ZeroCopy::kAuto), flags));
  g_object_class_install_property(
      oc, PROP_TRANSPORT,
      g_param_spec_enum("transport", "Transport",
                        "what senders may use: auto (shm, tcp, and rdma where this host has a usable RDMA device), "
                        "shm, tcp, rdma, or udp: the datagram transport (UD and RD senders on this UDP port, dgram_rc "
                        "on the TCP port of the same number; its buffers are always copied once). The srcs of one "
                        "listen address must agree",
                        GST_TYPE_SLOTSTREAM_TRANSPORT, gint(Transport::kAuto), flags));
  g_object_class_install_property(
      oc, PROP_STATS,
      g_param_spec_boxed("stats", "Statistics",
                         "buffers pushed since start: lent (the receive block itself, zero-copy) and copied (once: "
                         "zero-copy=off, a protocol that cannot lend, or a message larger than one block); also "
                         "posted as a slotstream-stats element message at end of stream",
                         GST_TYPE_STRUCTURE, GParamFlags(G_PARAM_READABLE | G_PARAM_STATIC_STRINGS)));
}

}  // namespace

static void gst_slotstream_src_class_init(GstSlotstreamSrcClass* klass) {
  GST_DEBUG_CATEGORY_INIT(slotstream_src_debug, "slotstreamsrc", 0, "slotstream source");
  auto* oc = G_OBJECT_CLASS(klass);
  oc->set_property = set_property;
  oc->get_property = get_property;
  oc->finalize = finalize;
  install_properties(oc);
  auto* ec = GST_ELEMENT_CLASS(klass);
  gst_element_class_add_static_pad_template(ec, &src_template);
  gst_element_class_set_static_metadata(
      ec, "slotstream source", "Source/Network",
      "Receives one device of a slotstreamsink over slotstream's one-sided RDMA transport (UCX: shm, tcp, rdma) and "
      "pushes one buffer per message with the sender's caps and timestamps (the sent time as a reference-timestamp "
      "meta, timestamp/x-slotstream-sent). Zero-copy: a buffer is its receive block itself, held until downstream "
      "frees "
      "it (status_byte senders; others, zero-copy=off and messages larger than a block are copied once). A lost "
      "sender is an error on the bus; its end of stream is EOS",
      "slotstream");
  auto* bc = GST_BASE_SRC_CLASS(klass);
  bc->start = start;
  bc->stop = stop;
  bc->negotiate = negotiate;
  bc->unlock = unlock;
  bc->unlock_stop = unlock_stop;
  GST_PUSH_SRC_CLASS(klass)->create = create;
}

static void gst_slotstream_src_init(GstSlotstreamSrc* self) {
  self->settings = new Settings;
  self->running = new Running;
  self->counters = new Counters;
  gst_base_src_set_live(GST_BASE_SRC(self), TRUE);
  gst_base_src_set_format(GST_BASE_SRC(self), GST_FORMAT_TIME);
}
