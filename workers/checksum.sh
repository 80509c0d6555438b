#!/bin/sh
# slotstream worker: one JSON line per message (SEQ, size, sha256) into results/SEQ.json.
# Contract: docs/workers.md. Idempotent per SEQ, so a restart never duplicates a result.
set -eu
in=$SLOTSTREAM_DEVICE_DIR; out=$SLOTSTREAM_WORKER_DIR; mkdir -p "$out/results"
first=$(ls "$in" | grep -E '^[0-9]{10}\.bin$' | head -n 1 | cut -c1-10)
first=$(echo "${first:-0}" | sed 's/^0*//'); first=${first:-0}   # decimal, not octal
seq=$(cat "$out/done" 2>/dev/null || echo $((first - 1)))
while :; do
  next=$(printf '%010d' $((seq + 1)))
  if [ ! -f "$in/$next.bin" ]; then
    # Numbers only grow in a directory but may skip those stored elsewhere (a stream that moved to
    # another receiver and back, docs/platform.md): a higher one present means the gap is final.
    above=$(ls "$in" | grep -E '^[0-9]{10}\.bin$' | awk -v s="$seq" '{ n = $1 + 0 } n > s { print n; exit }')
    if [ -n "$above" ]; then seq=$((above - 1)); continue; fi
    sleep 0.05; continue   # not arrived yet
  fi
  sum=$(sha256sum "$in/$next.bin" | cut -d' ' -f1); size=$(stat -c %s "$in/$next.bin")
  printf '{"device":%s,"seq":%d,"bytes":%s,"sha256":"%s"}\n' "$SLOTSTREAM_DEVICE" $((seq + 1)) "$size" "$sum" \
    > "$out/results/.$next.tmp" && mv "$out/results/.$next.tmp" "$out/results/$next.json"
  seq=$((seq + 1)); echo $seq > "$out/done.tmp" && mv "$out/done.tmp" "$out/done"
done
