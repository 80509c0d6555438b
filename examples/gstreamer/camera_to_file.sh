#!/usr/bin/env bash
# One camera through slotstream with GStreamer, on one host: a receiving pipeline (slotstreamsrc -> JPEG in an
# AVI file) and a sending one (videotestsrc -> slotstreamsink). On two hosts, run the two gst-launch-1.0 lines
# there, with listen=0.0.0.0:7000 and to=RECEIVER:7000.
#
#   bash examples/gstreamer/camera_to_file.sh [OUT.avi] [FRAMES]     (default /tmp/slotstream-camera.avi, 250)
#
# The plugin: GST_PLUGIN_PATH if set, else the source tree's build/gst, else the installed prefix's
# lib/gstreamer-1.0 (this script is installed as P/share/slotstream/examples/gstreamer/).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-/tmp/slotstream-camera.avi}
frames=${2:-250}
if [ -z "${GST_PLUGIN_PATH:-}" ]; then
  for dir in "$here/../../build/gst" "$here/../../../../lib/gstreamer-1.0"; do
    [ -e "$dir/libgstslotstream.so" ] && export GST_PLUGIN_PATH=$dir && break
  done
fi
log=$(mktemp)
trap 'rm -f "$log"; [ -n "${rx:-}" ] && kill "$rx" 2>/dev/null || true' EXIT

# Receiving side: listen on a free port (announced on the bus: -m prints the slotstream-listening message).
gst-launch-1.0 -m slotstreamsrc listen=127.0.0.1:0 device=0 ! videoconvert ! jpegenc ! avimux ! \
  filesink location="$out" >"$log" 2>&1 &
rx=$!
for _ in $(seq 100); do
  addr=$(grep -o 'slotstream-listening, address=(string)[^,]*' "$log" | head -1 | sed 's/.*(string)//') || true
  [ -n "$addr" ] && break
  sleep 0.1
done
[ -n "${addr:-}" ] || { echo "camera_to_file: the receiving pipeline did not start:" >&2; cat "$log" >&2; exit 1; }

# Sending side: 25 fps of 640x480 RGB, one message per frame; EOS after $frames frames ends both pipelines.
gst-launch-1.0 videotestsrc num-buffers="$frames" ! video/x-raw,width=640,height=480,format=RGB,framerate=25/1 ! \
  slotstreamsink to="$addr" device=0 sender-name=camera
wait "$rx"
rx=
echo "camera_to_file: $frames frames received into $out"
