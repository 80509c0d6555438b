// The `slotstream` GStreamer plugin: slotstreamsink and slotstreamsrc (gst-inspect-1.0 slotstream).
#include "elements.h"
#include "shared_receiver.h"

GST_DEBUG_CATEGORY_STATIC(slotstream_debug);
#define GST_CAT_DEFAULT slotstream_debug

GType gst_slotstream_transport_get_type(void) {
  static GType type = 0;
  static const GEnumValue values[] = {
      {gint(slotstream::Transport::kAuto),
       "shm when both ends share a host, else rdma when both have a usable RDMA "
       "device, else tcp",
       "auto"},
      {gint(slotstream::Transport::kShm), "shared memory within one host", "shm"},
      {gint(slotstream::Transport::kTcp), "TCP between hosts without RDMA NICs", "tcp"},
      {gint(slotstream::Transport::kRdma), "one-sided RDMA over an RDMA NIC (InfiniBand or RoCE; docs/rdma.md)",
       "rdma"},
      {gint(slotstream::Transport::kUdp), "the datagram transport: RDMA over UDP datagrams (docs/datagram.md)", "udp"},
      {0, nullptr, nullptr},
  };
  if (g_once_init_enter(&type)) g_once_init_leave(&type, g_enum_register_static("GstSlotstreamTransport", values));
  return type;
}

GType gst_slotstream_rdma_transport_get_type(void) {
  static GType type = 0;
  static const GEnumValue values[] = {
      {gint(slotstream::gst::RdmaChoice::kReceivers), "whichever the receiver serves (rc unless it says)", "any"},
      {gint(slotstream::gst::RdmaChoice::kRc), "reliable connection (rc_mlx5, rc_verbs)", "rc"},
      {gint(slotstream::gst::RdmaChoice::kDc), "dynamically connected (dc_mlx5, ConnectX only)", "dc"},
      {gint(slotstream::gst::RdmaChoice::kUd), "unreliable datagram with UCX's software reliability", "ud"},
      {0, nullptr, nullptr},
  };
  if (g_once_init_enter(&type)) {
    g_once_init_leave(&type, g_enum_register_static("GstSlotstreamRdmaTransport", values));
  }
  return type;
}

GType gst_slotstream_zero_copy_get_type(void) {
  static GType type = 0;
  static const GEnumValue values[] = {
      {gint(slotstream::gst::ZeroCopy::kAuto),
       "buffers are the receive blocks where the sender's protocol can lend them (status_byte), else copied once",
       "auto"},
      {gint(slotstream::gst::ZeroCopy::kOn),
       "buffers are the receive blocks; a sender whose protocol cannot lend them is an error", "on"},
      {gint(slotstream::gst::ZeroCopy::kOff), "every buffer is copied once out of its receive block", "off"},
      {0, nullptr, nullptr},
  };
  if (g_once_init_enter(&type)) g_once_init_leave(&type, g_enum_register_static("GstSlotstreamZeroCopy", values));
  return type;
}

static gboolean plugin_init(GstPlugin* plugin) {
  GST_DEBUG_CATEGORY_INIT(slotstream_debug, "slotstream", 0, "slotstream receiver");
  // The shared receiver's warnings (a device no src takes, a refused sender) go to GStreamer's log.
  slotstream::gst::ReceiverHub::set_log([](const std::string& text) { GST_WARNING("%s", text.c_str()); });
  gst_type_mark_as_plugin_api(GST_TYPE_SLOTSTREAM_TRANSPORT, GstPluginAPIFlags(0));
  gst_type_mark_as_plugin_api(GST_TYPE_SLOTSTREAM_RDMA_TRANSPORT, GstPluginAPIFlags(0));
  gst_type_mark_as_plugin_api(GST_TYPE_SLOTSTREAM_ZERO_COPY, GstPluginAPIFlags(0));
  return gst_element_register(plugin, "slotstreamsink", GST_RANK_NONE, GST_TYPE_SLOTSTREAM_SINK) &&
         gst_element_register(plugin, "slotstreamsrc", GST_RANK_NONE, GST_TYPE_SLOTSTREAM_SRC);
}

#define PACKAGE "slotstream"
GST_PLUGIN_DEFINE(GST_VERSION_MAJOR, GST_VERSION_MINOR, slotstream,
                  "slotstream: many device streams over one-sided RDMA (status-byte-assisted transmission over UCX)",
                  plugin_init, SLOTSTREAM_VERSION, "Apache 2.0", "slotstream",
                  "https://github.com/slotstream/slotstream")
