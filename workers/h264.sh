#!/bin/sh
# slotstream worker: encodes a device's raw rgb24 frames (SLOTSTREAM_FRAME, default 640x480) at
# SLOTSTREAM_FPS (default 25) into H.264 segments segments/<SEQ of its first frame>.mp4 of
# SLOTSTREAM_SEGMENT_FRAMES frames (default 50 = 2 s), each written atomically (temp + rename);
# a shorter segment is closed after SLOTSTREAM_IDLE_SECONDS (default 5) without a new frame.
# Contract: docs/workers.md, with one difference: `done` is recorded per finished segment (its
# last frame's SEQ), not per frame, so a restart redoes the unfinished segment from its first
# frame, under the same name. A frame of the wrong size stops the worker with an error.
set -eu
in=$SLOTSTREAM_DEVICE_DIR; out=$SLOTSTREAM_WORKER_DIR; mkdir -p "$out/segments"
size=${SLOTSTREAM_FRAME:-640x480}; fps=${SLOTSTREAM_FPS:-25}
per=${SLOTSTREAM_SEGMENT_FRAMES:-50}; idle=${SLOTSTREAM_IDLE_SECONDS:-5}
bytes=$(( ${size%x*} * ${size#*x} * 3 ))
first=$(ls "$in" | grep -E '^[0-9]{10}\.bin$' | head -n 1 | cut -c1-10)
first=$(echo "${first:-0}" | sed 's/^0*//'); first=${first:-0}   # decimal, not octal
done_seq=$(cat "$out/done" 2>/dev/null || echo $((first - 1)))
while :; do
  start=$((done_seq + 1)); n=0; waited=0
  while [ "$n" -lt "$per" ]; do   # collect up to $per consecutive frames
    f="$in/$(printf '%010d' $((start + n))).bin"
    if [ -f "$f" ]; then
      [ "$(stat -c %s "$f")" -eq "$bytes" ] || { echo "h264: $f is not one $size rgb24 frame ($bytes bytes)" >&2; exit 1; }
      n=$((n + 1)); waited=0; continue
    fi
    # A gap that will not fill (its numbers were stored elsewhere, docs/platform.md: a higher one is
    # here already): a segment ends before it, the next one starts after it.
    above=$(ls "$in" | grep -E '^[0-9]{10}\.bin$' | awk -v s=$((start + n)) '{ k = $1 + 0 } k > s { print k; exit }')
    if [ -n "$above" ]; then
      [ "$n" -gt 0 ] && break
      start=$above; continue
    fi
    [ "$n" -gt 0 ] && [ "$waited" -ge $((idle * 20)) ] && break
    sleep 0.05; waited=$((waited + 1))
  done
  seg=$(printf '%010d' "$start")
  i=0; while [ "$i" -lt "$n" ]; do cat "$in/$(printf '%010d' $((start + i))).bin"; i=$((i + 1)); done |
    ffmpeg -v error -y -f rawvideo -pix_fmt rgb24 -s "$size" -r "$fps" -i - -c:v libx264 -preset veryfast \
      -pix_fmt yuv420p -f mp4 "$out/segments/.$seg.tmp"
  mv "$out/segments/.$seg.tmp" "$out/segments/$seg.mp4"
  done_seq=$((start + n - 1)); echo "$done_seq" > "$out/done.tmp" && mv "$out/done.tmp" "$out/done"
done
