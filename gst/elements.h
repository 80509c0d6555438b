// The plugin's elements and what they share. GStreamer code lives in slotstream_sink.cc, slotstream_src.cc and
// plugin.cc; the connection sharing and the message layout beside them are plain C++ (shared_sender.h,
// shared_receiver.h, frame.h).
#pragma once

#include <gst/base/gstbasesink.h>
#include <gst/base/gstpushsrc.h>
#include <gst/gst.h>

#include <optional>
#include <string>

#include "slotstream/slotstream.h"

G_BEGIN_DECLS

#define GST_TYPE_SLOTSTREAM_SINK (gst_slotstream_sink_get_type())
G_DECLARE_FINAL_TYPE(GstSlotstreamSink, gst_slotstream_sink, GST, SLOTSTREAM_SINK, GstBaseSink)

#define GST_TYPE_SLOTSTREAM_SRC (gst_slotstream_src_get_type())
G_DECLARE_FINAL_TYPE(GstSlotstreamSrc, gst_slotstream_src, GST, SLOTSTREAM_SRC, GstPushSrc)

#define GST_TYPE_SLOTSTREAM_TRANSPORT (gst_slotstream_transport_get_type())
GType gst_slotstream_transport_get_type(void);
#define GST_TYPE_SLOTSTREAM_RDMA_TRANSPORT (gst_slotstream_rdma_transport_get_type())
GType gst_slotstream_rdma_transport_get_type(void);
#define GST_TYPE_SLOTSTREAM_ZERO_COPY (gst_slotstream_zero_copy_get_type())
GType gst_slotstream_zero_copy_get_type(void);  // slotstreamsrc's zero-copy: slotstream::gst::ZeroCopy

G_END_DECLS

namespace slotstream::gst {

// The reference-timestamp meta slotstreamsrc puts on every buffer whose sender had a clock: the sender's
// pipeline-clock time when slotstreamsink took the buffer. Two pipelines on one host both run on the system
// clock (monotonic), so `now - sent` is the latency through slotstream (bench/gst_cameras.py measures so).
inline constexpr const char* kSentMetaCaps = "timestamp/x-slotstream-sent";

// slotstreamsink's rdma-transport: RdmaOptions::transport, with "unset" as a value of its own (a GEnum has no
// optional).
enum class RdmaChoice { kReceivers, kRc, kDc, kUd };
inline std::optional<RdmaTransport> rdma_transport_of(RdmaChoice c) {
  switch (c) {
    case RdmaChoice::kRc:
      return RdmaTransport::kRc;
    case RdmaChoice::kDc:
      return RdmaTransport::kDc;
    case RdmaChoice::kUd:
      return RdmaTransport::kUd;
    default:
      return std::nullopt;
  }
}

// "<code>: <message>" of a failed slotstream call, for GST_ELEMENT_ERROR's debug text.
inline std::string detail(const Status& st) { return std::string(code_name(st.code())) + ": " + st.message(); }

}  // namespace slotstream::gst
