// slotstreamsink: each buffer becomes one slotstream message of its device (frame.h: caps once per stream,
// then buffer messages with their timestamps, then end of stream). Sinks of one sender-name share one
// connection (shared_sender.h). The buffer's bytes are copied once, into a send block (registered memory).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "elements.h"
#include "frame.h"
#include "shared_sender.h"
#include "slotstream/options.h"

GST_DEBUG_CATEGORY_STATIC(slotstream_sink_debug);
#define GST_CAT_DEFAULT slotstream_sink_debug

using namespace slotstream;
using namespace slotstream::gst;

namespace {

enum {
  PROP_0,
  PROP_TO,
  PROP_SENDER_NAME,
  PROP_DEVICE,
  PROP_TRANSPORT,
  PROP_RDMA_TRANSPORT,
  PROP_RDMA_DEVICE,
  PROP_PROTOCOL,
  PROP_BLOCKS,
  PROP_BLOCK_SIZE,
  PROP_TOKEN_FILE,
  PROP_MAX_WAIT,
  PROP_SEGMENT_SIZE,
  PROP_MAX_MESSAGE,
};

constexpr const char* kDefaultSenderName = "gstreamer";
constexpr guint kDefaultMaxWaitMs = 5000;

// The property values (under the object lock).
struct Settings {
  std::string to;
  std::string sender_name = kDefaultSenderName;
  guint device = 0;
  Transport transport = Transport::kAuto;
  RdmaChoice rdma_transport = RdmaChoice::kReceivers;
  std::string rdma_device;
  std::string protocol;  // "": the transport's default
  guint blocks = kDefaultBlocks;
  guint block_size = kDefaultBlockSize;
  std::string token_file;
  guint max_wait_ms = kDefaultMaxWaitMs;
  DatagramOptions datagram;  // transport udp
};

// What a started sink holds (streaming thread, and start/stop).
struct Running {
  std::shared_ptr<SharedSender> connection;
  uint16_t device = 0;
  std::chrono::milliseconds max_wait{0};
  std::string caps;  // the current caps, as text
  bool caps_sent = false;
};

}  // namespace

struct _GstSlotstreamSink {
  GstBaseSink parent;
  Settings* settings;
  Running* running;
  std::atomic<bool>* unlocking;  // unlock() was called: a failed send is a flush, not an error
};

G_DEFINE_TYPE(GstSlotstreamSink, gst_slotstream_sink, GST_TYPE_BASE_SINK)

namespace {

GstStaticPadTemplate sink_template = GST_STATIC_PAD_TEMPLATE("sink", GST_PAD_SINK, GST_PAD_ALWAYS, GST_STATIC_CAPS_ANY);

void set_string(std::string* field, const GValue* value) {
  const gchar* s = g_value_get_string(value);
  *field = s ? s : "";
}

void set_property(GObject* object, guint id, const GValue* value, GParamSpec* pspec) {
  auto* self = GST_SLOTSTREAM_SINK(object);
  GST_OBJECT_LOCK(self);
  Settings& s = *self->settings;
  switch (id) {
    case PROP_TO:
      set_string(&s.to, value);
      break;
    case PROP_SENDER_NAME:
      set_string(&s.sender_name, value);
      break;
    case PROP_DEVICE:
      s.device = g_value_get_uint(value);
      break;
    case PROP_TRANSPORT:
      s.transport = Transport(g_value_get_enum(value));
      break;
    case PROP_RDMA_TRANSPORT:
      s.rdma_transport = RdmaChoice(g_value_get_enum(value));
      break;
    case PROP_RDMA_DEVICE:
      set_string(&s.rdma_device, value);
      break;
    case PROP_PROTOCOL:
      set_string(&s.protocol, value);
      break;
    case PROP_BLOCKS:
      s.blocks = g_value_get_uint(value);
      break;
    case PROP_BLOCK_SIZE:
      s.block_size = g_value_get_uint(value);
      break;
    case PROP_TOKEN_FILE:
      set_string(&s.token_file, value);
      break;
    case PROP_MAX_WAIT:
      s.max_wait_ms = g_value_get_uint(value);
      break;
    case PROP_SEGMENT_SIZE:
      s.datagram.segment_size = g_value_get_uint(value);
      break;
    case PROP_MAX_MESSAGE:
      s.datagram.max_message = g_value_get_uint64(value);
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec);
      break;
  }
  GST_OBJECT_UNLOCK(self);
}

void get_property(GObject* object, guint id, GValue* value, GParamSpec* pspec) {
  auto* self = GST_SLOTSTREAM_SINK(object);
  GST_OBJECT_LOCK(self);
  const Settings& s = *self->settings;
  auto str = [](const std::string& v) { return v.empty() ? nullptr : v.c_str(); };
  switch (id) {
    case PROP_TO:
      g_value_set_string(value, str(s.to));
      break;
    case PROP_SENDER_NAME:
      g_value_set_string(value, s.sender_name.c_str());
      break;
    case PROP_DEVICE:
      g_value_set_uint(value, s.device);
      break;
    case PROP_TRANSPORT:
      g_value_set_enum(value, gint(s.transport));
      break;
    case PROP_RDMA_TRANSPORT:
      g_value_set_enum(value, gint(s.rdma_transport));
      break;
    case PROP_RDMA_DEVICE:
      g_value_set_string(value, str(s.rdma_device));
      break;
    case PROP_PROTOCOL:
      g_value_set_string(value, str(s.protocol));
      break;
    case PROP_BLOCKS:
      g_value_set_uint(value, s.blocks);
      break;
    case PROP_BLOCK_SIZE:
      g_value_set_uint(value, s.block_size);
      break;
    case PROP_TOKEN_FILE:
      g_value_set_string(value, str(s.token_file));
      break;
    case PROP_MAX_WAIT:
      g_value_set_uint(value, s.max_wait_ms);
      break;
    case PROP_SEGMENT_SIZE:
      g_value_set_uint(value, s.datagram.segment_size);
      break;
    case PROP_MAX_MESSAGE:
      g_value_set_uint64(value, s.datagram.max_message);
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec);
      break;
  }
  GST_OBJECT_UNLOCK(self);
}

// The property of a SenderOptions field that check_sender_options names ("block_size: ..." ->
// "block-size: ..."): the message is the library's, the name the element's.
Status as_property(const Status& st) {
  std::string text = st.message();
  const size_t colon = text.find(": ");
  if (colon != std::string::npos && find_option(text.substr(0, colon))) {
    std::replace(text.begin(), text.begin() + long(colon), '_', '-');
  }
  return {st.code(), text};
}

// The connection's options from the properties; an error names the property at fault.
Status make_spec(const Settings& s, ConnectionSpec* spec) {
  SenderOptions& o = *spec;
  if (s.to.empty()) return {Code::kInvalidArgument, "'to' is not set: give the receiver's HOST:PORT (to=host:7000)"};
  if (Status st = parse_address(s.to, &o.host, &o.port); !st.is_ok()) {
    return {st.code(), "to: " + st.message()};
  }
  if (o.port == 0) return {Code::kInvalidArgument, "to: port 0 names no receiver; give the port it listens on"};
  if (auto why = invalid_sender_name(s.sender_name)) return {Code::kInvalidArgument, "sender-name: " + *why};
  o.name = s.sender_name;
  o.transport = s.transport;
  o.rdma.transport = rdma_transport_of(s.rdma_transport);
  o.rdma.device = s.rdma_device;
  o.protocol = s.protocol;
  o.blocks = s.blocks;
  o.block_size = s.block_size;
  o.datagram = s.datagram;
  // The option schema's ranges (slotstream/options.h), said as every front end says them.
  if (Status st = check_sender_options(o); !st.is_ok()) return as_property(st);
  if (!s.token_file.empty()) {
    if (Status st = read_token_file(s.token_file, &o.token); !st.is_ok()) {
      return {st.code(), "token-file: " + st.message()};
    }
  }
  return Status::ok();
}

gboolean start(GstBaseSink* base) {
  auto* self = GST_SLOTSTREAM_SINK(base);
  GST_OBJECT_LOCK(self);
  Settings s = *self->settings;
  GST_OBJECT_UNLOCK(self);
  ConnectionSpec spec;
  Running r;
  Status st = make_spec(s, &spec);
  if (st.is_ok()) st = SharedSender::attach(spec, uint16_t(s.device), &r.connection);
  if (!st.is_ok()) {
    GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS, ("%s", st.message().c_str()), ("%s", detail(st).c_str()));
    return FALSE;
  }
  r.device = uint16_t(s.device);
  r.max_wait = std::chrono::milliseconds(s.max_wait_ms);
  *self->running = std::move(r);
  self->unlocking->store(false);
  GST_INFO_OBJECT(self, "device %u of sender-name '%s' to %s", s.device, s.sender_name.c_str(), s.to.c_str());
  return TRUE;
}

gboolean stop(GstBaseSink* base) {
  auto* self = GST_SLOTSTREAM_SINK(base);
  Running& r = *self->running;
  if (r.connection) {
    // A sink stopped without end of stream still ends its device cleanly: what it sent is complete.
    if (Status st = r.connection->detach(r.device, r.max_wait); !st.is_ok()) {
      GST_WARNING_OBJECT(self, "closing: %s", detail(st).c_str());  // render() reported the cause already
    }
  }
  *self->running = Running{};
  return TRUE;
}

gboolean set_caps(GstBaseSink* base, GstCaps* caps) {
  auto* self = GST_SLOTSTREAM_SINK(base);
  gchar* text = gst_caps_to_string(caps);
  if (self->running->caps != text) {
    self->running->caps = text;
    self->running->caps_sent = false;  // goes out before the next buffer: caps once per stream
  }
  g_free(text);
  return TRUE;
}

// A failed send or finish: a flush when unlock() interrupted it, otherwise an error on the bus that says
// which stream, which receiver, and what happened.
GstFlowReturn failed(GstSlotstreamSink* self, const Status& st) {
  if (self->unlocking->load()) return GST_FLOW_FLUSHING;
  const Running& r = *self->running;
  std::string what = st.message();
  if (r.connection) {
    const ConnectionSpec& spec = r.connection->spec();
    what = "device " + std::to_string(r.device) + " of sender-name '" + spec.name + "' to " + spec.host + ":" +
           std::to_string(spec.port) + ": " + what;
  }
  GST_ELEMENT_ERROR(self, RESOURCE, WRITE, ("%s", what.c_str()), ("%s", detail(st).c_str()));
  return GST_FLOW_ERROR;
}

// The sender's pipeline-clock time now (kNone without a clock): the receiving side measures latency from it.
uint64_t clock_now(GstElement* element) {
  GstClock* clock = gst_element_get_clock(element);
  if (!clock) return kNone;
  const GstClockTime t = gst_clock_get_time(clock);
  gst_object_unref(clock);
  return t;
}

GstFlowReturn render(GstBaseSink* base, GstBuffer* buffer) {
  auto* self = GST_SLOTSTREAM_SINK(base);
  Running& r = *self->running;
  if (!r.caps_sent) {
    if (r.caps.empty()) return failed(self, {Code::kProtocolError, "a buffer without caps"});
    std::vector<std::byte> caps = encode_caps(r.caps);
    if (Status st = r.connection->send(r.device, caps, r.max_wait); !st.is_ok()) return failed(self, st);
    r.caps_sent = true;
  }
  BufferHeader h;
  h.payload_length = gst_buffer_get_size(buffer);
  h.pts = GST_BUFFER_PTS(buffer);
  h.dts = GST_BUFFER_DTS(buffer);
  h.duration = GST_BUFFER_DURATION(buffer);
  h.offset = GST_BUFFER_OFFSET(buffer);
  h.offset_end = GST_BUFFER_OFFSET_END(buffer);
  h.flags = GST_BUFFER_FLAGS(buffer);
  h.sent = clock_now(GST_ELEMENT(self));
  std::array<std::byte, kBufferHeaderSize> header;
  encode_buffer_header(h, header);
  // Header and payload are written straight into the send block(s): the one copy on this side.
  auto fill = [&](uint64_t offset, std::span<std::byte> dst) {
    size_t done = 0;
    if (offset < kBufferHeaderSize) {
      done = std::min<size_t>(kBufferHeaderSize - offset, dst.size());
      std::memcpy(dst.data(), header.data() + offset, done);
    }
    if (done < dst.size()) {
      const uint64_t from = offset + done - kBufferHeaderSize;
      gst_buffer_extract(buffer, from, dst.data() + done, dst.size() - done);
    }
    return Status::ok();
  };
  Status st = r.connection->send(r.device, kBufferHeaderSize + h.payload_length, fill, r.max_wait);
  return st.is_ok() ? GST_FLOW_OK : failed(self, st);
}

// End of stream: the device's end message, then (the last device of the sender-name) the connection is
// finished — the EOS message is posted once the receiver has stored everything.
gboolean event(GstBaseSink* base, GstEvent* ev) {
  auto* self = GST_SLOTSTREAM_SINK(base);
  Running& r = *self->running;
  if (GST_EVENT_TYPE(ev) == GST_EVENT_EOS && r.connection) {
    Status st = r.connection->send(r.device, encode_eos(), r.max_wait);
    if (st.is_ok()) st = r.connection->end_device(r.device, r.max_wait);
    if (!st.is_ok() && failed(self, st) == GST_FLOW_ERROR) {
      gst_event_unref(ev);
      return FALSE;
    }
  }
  return GST_BASE_SINK_CLASS(gst_slotstream_sink_parent_class)->event(base, ev);
}

gboolean unlock(GstBaseSink* base) {
  auto* self = GST_SLOTSTREAM_SINK(base);
  self->unlocking->store(true);
  if (self->running->connection && self->running->connection->interrupt(self->running->device)) {
    GST_INFO_OBJECT(self, "interrupted a send waiting for the receiver: the connection is closed");
  }
  return TRUE;
}

gboolean unlock_stop(GstBaseSink* base) {
  GST_SLOTSTREAM_SINK(base)->unlocking->store(false);
  return TRUE;
}

void finalize(GObject* object) {
  auto* self = GST_SLOTSTREAM_SINK(object);
  delete self->settings;
  delete self->running;
  delete self->unlocking;
  G_OBJECT_CLASS(gst_slotstream_sink_parent_class)->finalize(object);
}

// The protocols of one engine: "ucx" (shm, tcp, rdma) or "dgram" (udp).
std::string protocol_names(const std::string& engine) {
  std::string names;
  for (const ProtocolInfo& p : protocols()) {
    if (p.engine == engine) names += (names.empty() ? "" : ", ") + p.name;
  }
  return names;
}

// A property's blurb with its range from the option schema ("..., 1..4096").
std::string ranged(const char* blurb, const char* option) {
  const OptionSpec& o = *find_option(option);
  char range[96];
  if (o.kind == OptionKind::kSize) {
    std::snprintf(range, sizeof range, "; %s..%s", format_size(uint64_t(o.min)).c_str(),
                  format_size(uint64_t(o.max)).c_str());
  } else {
    std::snprintf(range, sizeof range, "; %.0f..%.0f", o.min, o.max);
  }
  return blurb + std::string(range);
}

constexpr auto kPropertyFlags = GParamFlags(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_READY);

// Where the stream goes: the receiver, the connection's name, the device, the wire.
void install_address_properties(GObjectClass* oc) {
  const auto flags = kPropertyFlags;
  g_object_class_install_property(
      oc, PROP_TO,
      g_param_spec_string(
          "to", "Receiver",
          "HOST:PORT of the receiver: `slotstream recv --listen`, or a slotstreamsrc's listen (required)", nullptr,
          flags));
  g_object_class_install_property(
      oc, PROP_SENDER_NAME,
      g_param_spec_string(
          "sender-name", "Sender name",
          "name of the connection (1-64 of [A-Za-z0-9._-]); every slotstreamsink of one sender-name in "
          "this process shares one connection, which must then have the same to, transport, "
          "rdma-transport, rdma-device, protocol, blocks, block-size and token-file; two processes sending to "
          "one receiver need different names",
          kDefaultSenderName, flags));
  g_object_class_install_property(
      oc, PROP_DEVICE,
      g_param_spec_uint("device", "Device", "this stream's device number on the connection (one sink per device)", 0,
                        65535, 0, flags));
  g_object_class_install_property(
      oc, PROP_TRANSPORT,
      g_param_spec_enum(
          "transport", "Transport",
          "wire: shm within a host, rdma between hosts with RDMA NICs (InfiniBand, RoCE), tcp between hosts "
          "without; auto: shm when both ends share a host, else rdma when both have a usable RDMA device, else tcp; "
          "udp: the datagram transport (its own protocols, segment-size, max-message)",
          GST_TYPE_SLOTSTREAM_TRANSPORT, gint(Transport::kAuto), flags));
  g_object_class_install_property(
      oc, PROP_RDMA_TRANSPORT,
      g_param_spec_enum("rdma-transport", "RDMA transport",
                        "for transport rdma (or auto choosing it): UCX's RDMA transport; any follows the receiver, a "
                        "receiver that serves another one refuses the connection",
                        GST_TYPE_SLOTSTREAM_RDMA_TRANSPORT, gint(RdmaChoice::kReceivers), flags));
  g_object_class_install_property(
      oc, PROP_RDMA_DEVICE,
      g_param_spec_string("rdma-device", "RDMA device",
                          "for transport rdma: UCX's device NAME:PORT (e.g. mlx5_0:1, `slotstream transports` lists "
                          "them); unset: any device UCX finds. UCX_NET_DEVICES in the environment wins",
                          nullptr, flags));
}

// How it flows: protocol, receive blocks, authentication, back-pressure.
void install_flow_properties(GObjectClass* oc) {
  const auto flags = kPropertyFlags;
  // The blurbs are static: they live as long as the process (GParamSpec keeps the pointers).
  static const std::string protocol_blurb =
      "flow-control protocol, NAME or NAME:key=value,... (`slotstream protocols`); unset: status_byte, udp: "
      "write_record. Over shm, tcp, rdma: " +
      protocol_names("ucx") + "; over udp: " + protocol_names("dgram") + " (dgram_rc: transport tcp)";
  static const std::string blocks_blurb = ranged(
      "receive blocks the receiver gives this connection (the default keeps more than two 640x480 RGB frames in "
      "flight for each of 12 cameras; udp: message slots per device, at most 1024)",
      "blocks");
  static const std::string block_size_blurb = ranged(
      "bytes per block; a buffer larger than a block minus 96 bytes of headers is sent in several blocks (and copied "
      "on the receiving side); not for udp",
      "block_size");
  static const std::string segment_blurb =
      ranged("transport udp: payload bytes per datagram (1408 fits a 1500-byte Ethernet MTU)", "segment_size");
  static const std::string max_message_blurb = ranged(
      "transport udp: the largest buffer (with its 96 bytes of headers) this connection sends: the receiver's "
      "region per message slot",
      "max_message");
  g_object_class_install_property(oc, PROP_PROTOCOL,
                                  g_param_spec_string("protocol", "Protocol", protocol_blurb.c_str(), nullptr, flags));
  // Ranges are checked when the element starts, against the option schema (slotstream/options.h): one message
  // for a value outside, the same as the CLI's and Python's (GObject's own check would only warn and keep
  // the old value).
  g_object_class_install_property(
      oc, PROP_BLOCKS,
      g_param_spec_uint("blocks", "Blocks", blocks_blurb.c_str(), 0, G_MAXUINT, kDefaultBlocks, flags));
  g_object_class_install_property(
      oc, PROP_BLOCK_SIZE,
      g_param_spec_uint("block-size", "Block size", block_size_blurb.c_str(), 0, G_MAXUINT, kDefaultBlockSize, flags));
  g_object_class_install_property(oc, PROP_SEGMENT_SIZE,
                                  g_param_spec_uint("segment-size", "Segment size", segment_blurb.c_str(), 0, G_MAXUINT,
                                                    DatagramOptions{}.segment_size, flags));
  g_object_class_install_property(oc, PROP_MAX_MESSAGE,
                                  g_param_spec_uint64("max-message", "Largest message", max_message_blurb.c_str(), 0,
                                                      G_MAXUINT64, DatagramOptions{}.max_message, flags));
  g_object_class_install_property(
      oc, PROP_TOKEN_FILE,
      g_param_spec_string("token-file", "Token file",
                          "file holding the shared secret the receiver asks for (HMAC challenge; the token never "
                          "crosses the wire)",
                          nullptr, flags));
  g_object_class_install_property(
      oc, PROP_MAX_WAIT,
      g_param_spec_uint("max-wait", "Maximum wait",
                        "milliseconds a buffer may wait for room at the receiver (back-pressure blocks the streaming "
                        "thread) before the connection fails with an error on the bus; 0: wait for ever",
                        0, G_MAXUINT, kDefaultMaxWaitMs, flags));
}

}  // namespace

static void gst_slotstream_sink_class_init(GstSlotstreamSinkClass* klass) {
  GST_DEBUG_CATEGORY_INIT(slotstream_sink_debug, "slotstreamsink", 0, "slotstream sink");
  auto* oc = G_OBJECT_CLASS(klass);
  oc->set_property = set_property;
  oc->get_property = get_property;
  oc->finalize = finalize;
  install_address_properties(oc);
  install_flow_properties(oc);
  auto* ec = GST_ELEMENT_CLASS(klass);
  gst_element_class_add_static_pad_template(ec, &sink_template);
  gst_element_class_set_static_metadata(
      ec, "slotstream sink", "Sink/Network",
      "Sends each buffer as one message of a device over slotstream's one-sided RDMA transport (UCX: shm, tcp, "
      "rdma) or its datagram transport (udp): caps once per stream, timestamps with every buffer, end of stream "
      "finishes the device; sinks of one "
      "sender-name share one connection; back-pressure blocks the streaming thread up to max-wait",
      "slotstream");
  auto* bc = GST_BASE_SINK_CLASS(klass);
  bc->start = start;
  bc->stop = stop;
  bc->set_caps = set_caps;
  bc->render = render;
  bc->event = event;
  bc->unlock = unlock;
  bc->unlock_stop = unlock_stop;
}

static void gst_slotstream_sink_init(GstSlotstreamSink* self) {
  self->settings = new Settings;
  self->running = new Running;
  self->unlocking = new std::atomic<bool>(false);
}
