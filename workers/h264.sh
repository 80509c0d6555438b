#!/bin/sh
# slotstream worker: encodes a device's raw frames (640x480 rgb24 by default) into H.264
# segments, segments/<SEQ of its first frame>.mp4, SLOTSTREAM_SEGMENT_FRAMES frames each (a shorter last segment
# after SLOTSTREAM_IDLE_SECONDS without new frames). Contract: docs/workers.md. `done` is
# recorded once per finished segment, so a restart redoes only the unfinished segment.
set -eu
in=$SLOTSTREAM_DEVICE_DIR; out=$SLOTSTREAM_WORKER_DIR; mkdir -p "$out/segments"
size=${SLOTSTREAM_FRAME:-640x480}; fps=${SLOTSTREAM_FPS:-25}
per=${SLOTSTREAM_SEGMENT_FRAMES:-50}; idle=${SLOTSTREAM_IDLE_SECONDS:-5}
first=$(ls "$in" | grep -E '^[0-9]{10}\.bin$' | head -n 1 | cut -c1-10)
first=$(echo "${first:-0}" | sed 's/^0*//'); first=${first:-0}   # decimal, not octal
done_seq=$(cat "$out/done" 2>/dev/null || echo $((first - 1)))
while :; do
  start=$((done_seq + 1)); n=0; waited=0
  while [ "$n" -lt "$per" ]; do   # collect up to $per consecutive frames
    f="$in/$(printf '%010d' $((start + n))).bin"
    if [ -f "$f" ]; then n=$((n + 1)); waited=0; continue; fi
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
