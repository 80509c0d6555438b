#!/usr/bin/env bash
# Checks slotstream's rdma transport on a host with RDMA NICs (docs/rdma.md). Verified on Soft-RoCE (rc_verbs) in the
# VM of scripts/softroce-vm.sh by tests/rdma (bash tests/rdma/run.sh); rc_mlx5 and dc need a ConnectX.
#
#   bash scripts/rdma-check.sh              one host: both ends here, through the NIC (rc loopback)
#   bash scripts/rdma-check.sh PEER_HOST    two hosts: the receivers run on PEER_HOST over ssh (same
#                                           build at the same path there, or PEER_BIN=/path/to/slotstream)
#
# Steps: the devices and ports (`slotstream transports`), the locked-memory limit and RoCE's GID
# index; ucx_perftest put latency and bandwidth over rc (the ceiling); `slotstream bench latency` and
# `throughput --quick --transport rdma` for status_byte, sliding_window and credit (two hosts: the
# bench's peers directly, throughput only — one-way latency needs one clock); the status-byte
# receiver's progress_calls, which must be 0 (the passive receiver); content: every message of
# several runs carries a payload derived from its device and number, checked by `slotstream verify`
# (1 MiB frames, two senders at once, one run longer than UCX's 20 s keep-alive), with the UCX lanes
# each sender used; a verdict with ratios to ucx_perftest. Settings: RDMA_TRANSPORT (rc), RDMA_DEVICE
# (NAME:PORT), OUT (a fresh directory), SLOTSTREAM_BIN, PEER_BIN, SSH (ssh), RDMA_CHECK_QUICK=1 (fewer
# ucx_perftest iterations and the bench's tiny sizes: for an emulated NIC), RDMA_CHECK_LONG_SECONDS (25).
# RDMA_CHECK_TRANSPORT=shm runs every step over shared memory instead (and RDMA_CHECK_TINY=1 with the
# bench's tiny sizes): a check of this script on a machine without a NIC, which says nothing about rdma
# (tests/integration/test_rdma.py runs it).
# Exit: 0 the verdict is PASS; 1 a check failed; 2 usage; 77 nothing to check here (no RDMA device).
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${SLOTSTREAM_BIN:-$PWD/build/slotstream}
PEER=${1:-}
PEER_BIN=${PEER_BIN:-$BIN}
SSH=${SSH:-ssh}
KIND=${RDMA_TRANSPORT:-rc}
DEVICE=${RDMA_DEVICE:-}
T=${RDMA_CHECK_TRANSPORT:-rdma}
PROTOCOLS=status_byte,sliding_window,credit
SIZES=--quick
QUICK=${RDMA_CHECK_QUICK:-}
if [ "${RDMA_CHECK_TINY:-}" = 1 ] || [ "$QUICK" = 1 ]; then SIZES=--tiny; fi
LONG_SECONDS=${RDMA_CHECK_LONG_SECONDS:-25}
if [ $# -gt 1 ] || [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then sed -n '2,24p' "$0"; exit 2; fi
[ -x "$BIN" ] || { echo "rdma-check: no slotstream binary at $BIN (bash scripts/build.sh, or SLOTSTREAM_BIN)"; exit 2; }

rdma_args=(--rdma-transport "$KIND")
[ -n "$DEVICE" ] && rdma_args+=(--rdma-device "$DEVICE")
peer_args=(--transport "$T")
[ "$T" = rdma ] && peer_args+=("${rdma_args[@]}")

# 1. Is there anything to check? One line and 77 where there is not (slotstream asks UCX itself).
listing=$("$BIN" transports --json "${rdma_args[@]}") || { echo "rdma-check: slotstream transports failed"; exit 1; }
why=$(python3 -c 'import json,sys; t={x["name"]: x for x in json.load(sys.stdin)}[sys.argv[1]]; print("" if t["available"] else t["why"])' "$T" <<<"$listing")
if [ -n "$why" ]; then
  echo "rdma-check: $why; nothing to check on this host"
  exit 77
fi
OUT=${OUT:-$(mktemp -d /tmp/rdma-check.XXXXXX)}
mkdir -p "$OUT"
[ "$T" = rdma ] || KIND=$T  # the dry run: shm throughout
echo "== rdma-check: $KIND${DEVICE:+ on $DEVICE}${PEER:+, receiver on $PEER}; results in $OUT"

# 2. Devices, ports, the locked-memory limit, RoCE's GID index.
"$BIN" transports "${rdma_args[@]}" | sed -n '/^rdma/,/^udp/p' | sed '$d'
echo "locked-memory limit here (ulimit -l): $(ulimit -l)${PEER:+; on $PEER: $($SSH "$PEER" 'ulimit -l' 2>/dev/null)}"
for types in /sys/class/infiniband/*/ports/*/gid_attrs/types/*; do
  [ -r "$types" ] && [ "$(cat "$types" 2>/dev/null)" = "RoCE v2" ] || continue
  gid=$(cat "${types/gid_attrs\/types/gids}" 2>/dev/null)
  case "$gid" in 0000:0000:0000:0000:0000:0000:0000:0000|fe80:*) continue ;; esac
  port=${types%/gid_attrs/*}
  echo "RoCE v2 GID index ${types##*/} on ${port#/sys/class/infiniband/} ($gid): UCX_IB_GID_INDEX=${types##*/} on both ends if UCX picks another"
done
# ucx_perftest connects by worker address: its wire-up goes over ud ("rc" is rc with ud:aux), whose
# destination check in UCX 1.13 drops every IPv4 RoCE packet on NICs other than ConnectX (docs/rdma.md).
ucx_env=(env "UCX_TLS=$KIND" UCX_UD_VERBS_ETH_DGID_CHECK=n)
[ "$T" = shm ] && ucx_env=(env "UCX_TLS=posix,sysv")
[ -n "$DEVICE" ] && ucx_env+=("UCX_NET_DEVICES=$DEVICE")

# 3. ucx_perftest: the server here (one host) or on PEER, the client here. Prints the "Final:" numbers.
# A point is tried with up to three servers, each on a fresh random port (a port another program
# holds, or a server that exited after a failed client, is not retried forever); what the last
# client and server said goes to stderr when every try failed.
perftest_once() {  # PORT TEST SIZE ITERATIONS
  local port=$1 server target=127.0.0.1
  shift
  if [ -n "$PEER" ]; then
    $SSH "$PEER" "${ucx_env[*]} ucx_perftest -p $port -t $1 -s $2 -n $3" >"$OUT/perftest-server.log" 2>&1 &
    target=$PEER
  else
    "${ucx_env[@]}" ucx_perftest -p "$port" -t "$1" -s "$2" -n "$3" >"$OUT/perftest-server.log" 2>&1 &
  fi
  server=$!
  local out=""
  for _ in $(seq 40); do
    sleep 0.25
    out=$("${ucx_env[@]}" timeout 120 ucx_perftest "$target" -p "$port" -t "$1" -s "$2" -n "$3" 2>&1) && break
  done
  kill "$server" 2>/dev/null; wait "$server" 2>/dev/null
  printf '%s\n' "$out" >"$OUT/perftest-client.log"
  grep '^Final:' <<<"$out" | sed 's/^Final://'
}
perftest() {  # TEST SIZE ITERATIONS
  local final
  for _ in 1 2 3; do
    final=$(perftest_once $((20000 + RANDOM % 12000)) "$@")  # below Linux's ephemeral ports (32768-)
    [ -n "$final" ] && { echo "$final"; return; }
  done
  { echo "-- last ucx_perftest client:"; tail -n 5 "$OUT/perftest-client.log"
    echo "-- last ucx_perftest server:"; tail -n 5 "$OUT/perftest-server.log"; } >&2
}
command -v ucx_perftest >/dev/null || { echo "rdma-check: ucx_perftest not found (apt-get install ucx-utils)"; exit 1; }
echo "== ucx_perftest over $KIND"
: >"$OUT/perftest.txt"
points=("ucp_put_lat 64 10000" "ucp_put_bw 65536 20000" "ucp_put_bw 1048576 2000")
[ "$QUICK" = 1 ] && points=("ucp_put_lat 64 1000" "ucp_put_bw 65536 2000" "ucp_put_bw 1048576 200")
for point in "${points[@]}"; do
  read -r test size iters <<<"$point"
  final=$(perftest "$test" "$size" "$iters")
  [ -n "$final" ] || { echo "rdma-check: FAIL: ucx_perftest $test $size B gave no result over $KIND"; exit 1; }
  echo "$test $size $final" | tee -a "$OUT/perftest.txt"
done

# 4. slotstream over rdma. One host: the bench (its peers, ucx_perftest and ucx_raw_put beside them).
# Two hosts: receiver peers on PEER over ssh, sender peers here.
peer_pair() {  # PROTOCOL SIZE COUNT BLOCKS FILE: one bench-peer pair; writes "sender JSON\nreceiver JSON" to FILE
  local rx to
  if [ -n "$PEER" ]; then
    $SSH "$PEER" "$PEER_BIN bench-peer recv --listen 0.0.0.0:0 ${peer_args[*]}" >"$5.rx" 2>&1 &
  else
    "$BIN" bench-peer recv --listen 127.0.0.1:0 "${peer_args[@]}" >"$5.rx" 2>&1 &
  fi
  rx=$!
  for _ in $(seq 40); do grep -q '^listening on' "$5.rx" 2>/dev/null && break; sleep 0.25; done
  to=$(sed -n 's/^listening on //p' "$5.rx")
  [ -n "$PEER" ] && to=$PEER:${to##*:}
  timeout 300 "$BIN" bench-peer send --to "$to" "${peer_args[@]}" --protocol "$1" --size "$2" --count "$3" \
    --blocks "$4" >"$5" 2>"$5.err"
  local rc=$?
  for _ in $(seq 40); do grep -q '^{' "$5.rx" && break; sleep 0.25; done
  kill "$rx" 2>/dev/null; wait "$rx" 2>/dev/null
  grep '^{' "$5.rx" >>"$5"
  return $rc
}
failed=0
if [ -z "$PEER" ]; then
  echo "== slotstream bench latency and throughput $SIZES --transport $T ($PROTOCOLS)"
  # --force: these runs check that every path works (in the VM, TCG keeps the load high); not figures.
  bench_args=(--transport "$T" --force)
  [ "$T" = rdma ] && bench_args+=(--rdma-transport "$KIND" ${DEVICE:+--rdma-device "$DEVICE"})
  for exp in latency throughput; do
    "$BIN" bench "$exp" "$SIZES" "${bench_args[@]}" --protocols "$PROTOCOLS" --out "$OUT/$exp" >"$OUT/$exp.log" 2>&1 ||
      { echo "bench $exp failed: $OUT/$exp.log"; failed=1; }
    grep -E '^\[|^  !' "$OUT/$exp.log" | tail -20
  done
else
  echo "== slotstream over $T to $PEER (bench-peer pairs; throughput only)"
  for p in ${PROTOCOLS//,/ }; do
    for size in 65536 1048576; do
      peer_pair "$p" "$size" $((size > 65536 ? 500 : 5000)) 32 "$OUT/pair-$p-$size.json" || {
        echo "$p $size B: FAILED ($(tail -1 "$OUT/pair-$p-$size.json.err"))"; failed=1; }
    done
  done
fi

# 5. The passive receiver: status_byte's receiver makes no progress call on rc or dc.
echo "== passive receiver: status_byte, 64 KiB x 2000 over $KIND"
peer_pair status_byte 65536 2000 3 "$OUT/passive.json"
rc=$?
if [ "$rc" -eq 124 ]; then  # timeout's: still running after 300 s (Soft-RoCE: docs/rdma.md, "A stall in Soft-RoCE")
  echo "passive check: the pair failed: the sender was still running after 300 s (a stall)"
  failed=1
elif [ "$rc" -ne 0 ]; then
  echo "passive check: the pair failed (sender exit $rc): $(tail -n 1 "$OUT/passive.json.err")"
  failed=1
fi

# 6. Content: every message carries a payload derived from its device and number (send --synthetic,
# tools/synthetic.h); `slotstream verify` checks each one stored: a torn or stale block, a message in
# the wrong place or out of order fails. 1 MiB frames in 1 MiB blocks (each spans two); two senders
# at once; a run longer than UCX's keep-alive interval (20 s: a lane that UCX's keep-alive would fail
# shows here). Each sender's transport line names the UCX lanes it used.
echo "== content: checked synthetic payloads over $T (a run of ${LONG_SECONDS} s among them)"
: >"$OUT/problems.txt"
cdir=$OUT/content
if [ -n "$PEER" ]; then
  cdir=/tmp/rdma-check-content.$$
  $SSH "$PEER" "$PEER_BIN recv --listen 0.0.0.0:0 --out $cdir ${peer_args[*]}" >"$OUT/content-recv.log" 2>&1 &
else
  "$BIN" recv --listen 127.0.0.1:0 --out "$cdir" "${peer_args[@]}" >"$OUT/content-recv.log" 2>&1 &
fi
crx=$!
for _ in $(seq 240); do grep -q '^listening on' "$OUT/content-recv.log" 2>/dev/null && break; sleep 0.25; done
cto=$(sed -n 's/^listening on //p' "$OUT/content-recv.log")
[ -n "$PEER" ] && cto=$PEER:${cto##*:}
content_send() {  # NAME ARGS...: one sender; its JSON summary in $OUT/content-NAME.json, its stderr beside it
  local name=$1
  shift
  timeout $((LONG_SECONDS + 300)) "$BIN" send --to "$cto" --name "$name" "${peer_args[@]}" --json "$@" \
    >"$OUT/content-$name.json" 2>"$OUT/content-$name.err" ||
    echo "content: sender $name failed: $(tail -n 1 "$OUT/content-$name.err")" >>"$OUT/problems.txt"
  sed -n 's/^slotstream send: transport /  '"$name"': transport /p' "$OUT/content-$name.err"
}
if [ -n "$cto" ]; then
  content_send mib --synthetic 0-1:4:1024x1024x1 --duration 3 --blocks 8 --block-size 1M
  content_send multi-a --synthetic 0-2:10:320x240x3 --duration 3 --blocks 4 &
  ca=$!
  content_send multi-b --protocol sliding_window --synthetic 0-1:10:320x240x3 --duration 3 --blocks 4
  wait "$ca"
  content_send long --synthetic 0:4:64x64x3 --duration "$LONG_SECONDS" --blocks 4 --block-size 64K
else
  echo "content: the receiver did not start: $(tail -n 2 "$OUT/content-recv.log")" >>"$OUT/problems.txt"
fi
kill "$crx" 2>/dev/null; wait "$crx" 2>/dev/null
if [ -n "$PEER" ]; then
  $SSH "$PEER" "$PEER_BIN verify $cdir; rm -rf $cdir" >"$OUT/verify.txt" 2>&1
else
  "$BIN" verify "$cdir" >"$OUT/verify.txt" 2>&1
fi
verify_rc=$?
python3 - "$OUT" "$verify_rc" <<'EOF'
import json, pathlib, re, sys
out, rc = pathlib.Path(sys.argv[1]), int(sys.argv[2])
sent = 0
for f in sorted(out.glob("content-*.json")):
    try:
        sent += json.loads(f.read_text())["messages"]
    except (ValueError, KeyError):
        pass
text = (out / "verify.txt").read_text()
m = re.search(r"verified (\d+) frames in (\d+) devices", text)
got = int(m.group(1)) if m else 0
line = f"content: {got} of {sent} messages verified (each a unique payload: device, number, size)"
print(line)
if rc != 0 or not m or got != sent or sent == 0:
    last = text.strip().splitlines()[-1] if text.strip() else "(nothing)"
    with open(out / "problems.txt", "a") as p:
        p.write(f"{line}; slotstream verify said: {last}\n")
EOF

# 7. The verdict, with ratios to ucx_perftest. Whether the receiver must stay passive is what the
# protocol and transport promise (`slotstream protocols --json`: receiver_progress_on).
"$BIN" protocols --json >"$OUT/protocols.json"
python3 - "$OUT" "$KIND" "${PEER:-}" "$failed" "$T" <<'EOF'
import json, pathlib, statistics, sys
out, kind, peer, failed, transport = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4] == "1", sys.argv[5]
perf = {}
for line in (out / "perftest.txt").read_text().split("\n"):
    if line.strip():
        test, size, *nums = line.split()
        perf[(test, int(size))] = [float(x) for x in nums]
# Final: iterations, latency p / avg / overall (us), bandwidth avg / overall (MiB/s), rate avg / overall (msg/s)
put_bw = {s: v[7] * s / 1e6 for (t, s), v in perf.items() if t == "ucp_put_bw"}
put_lat = perf[("ucp_put_lat", 64)][2]
print(f"ucx_perftest over {kind}: put latency 64 B {put_lat:.2f} us; put bandwidth " +
      ", ".join(f"{s // 1024} KiB {v:.0f} MB/s" for s, v in sorted(put_bw.items())))
problems = ["a step failed (see above)"] if failed else []
problems += [l for l in (out / "problems.txt").read_text().splitlines() if l.strip()]
rows = []
if not peer:
    for exp in ("throughput", "latency"):
        f = out / exp / "results.json"
        if not f.exists():
            problems.append(f"no {exp} results")
            continue
        doc = json.loads(f.read_text())
        problems += [f"bench: {e['what']}: {e['error']}" for e in doc["errors"]]
        recs = [r for r in doc["records"] if r["transport"] == transport]
        for p in ("status_byte", "sliding_window", "credit"):
            blocks = max((r["blocks"] for r in recs if r["metric"] == "throughput"), default=0)  # 32 (quick)
            for s in sorted({r["size_bytes"] for r in recs if r["protocol"] == p}):
                tp = [r["value"] for r in recs if (r["protocol"], r["size_bytes"], r["metric"]) == (p, s, "throughput")
                      and r["blocks"] == blocks]
                lat = [r["value"] for r in recs if (r["protocol"], r["size_bytes"], r["metric"]) == (p, s, "latency_p50")]
                ceil = [r["value"] for r in doc["records"] if r["protocol"] == "ucx_perftest_put_bw" and r["size_bytes"] == s
                        and r["metric"] == "throughput"]
                if tp and ceil:
                    rows.append(f"{p:15} {s:>8} B  {statistics.median(tp):9.1f} MB/s ({blocks} blocks)  "
                                f"{statistics.median(tp) / ceil[0]:6.3f}x ucx_perftest put_bw")
                if lat:
                    raw = [r["value"] for r in recs if (r["protocol"], r["size_bytes"], r["metric"]) == ("ucx_raw_put", s, "latency_p50")]
                    ratio = f"{lat[0] / raw[0]:6.2f}x ucx_perftest put_lat" if raw and raw[0] > 0 else ""
                    rows.append(f"{p:15} {s:>8} B  p50 {lat[0]:8.2f} us  {ratio}")
else:
    for f in sorted(out.glob("pair-*.json")):
        lines = [json.loads(l) for l in f.read_text().splitlines() if l.startswith("{")]
        snd = next((l for l in lines if l.get("event") == "sender"), None)
        if not snd:
            problems.append(f"{f.name}: no sender report")
            continue
        s = snd["size"]
        ratio = f"{snd['mb_per_s'] / put_bw[s]:6.3f}x ucx_perftest put_bw" if s in put_bw else ""
        rows.append(f"{snd['protocol']:15} {s:>8} B  {snd['mb_per_s']:9.1f} MB/s  {ratio}")
print("\n".join(rows))
passive = [json.loads(l) for l in (out / "passive.json").read_text().splitlines() if l.startswith("{")] \
    if (out / "passive.json").exists() else []
rcv = next((l for l in passive if l.get("event") == "session"), None)
takes_part = False
if not rcv:
    problems.append("the passive check gave no receiver report")
else:
    calls = rcv["resources"]["progress_calls"]
    print(f"status_byte receiver over {kind}: {rcv['messages']} messages, progress_calls {calls}, "
          f"setup_progress_calls {rcv['resources'].get('setup_progress_calls')}")
    if rcv["messages"] != 2000:
        problems.append(f"the passive check delivered {rcv['messages']} of 2000 messages")
    key = f"rdma:{kind}" if transport == "rdma" else transport
    takes_part = {p["name"]: p for p in json.loads((out / "protocols.json").read_text())}["status_byte"][
        "receiver_progress_on"][key]
    if not takes_part and calls != 0:
        problems.append(f"the status-byte receiver made {calls} progress calls over {key}: it is not passive")
    if takes_part and calls == 0:
        problems.append(f"the status-byte receiver made no progress call over {key}, where its RMA needs one")
verdict = ("PASS: rdma moves data one-sided with a passive status-byte receiver" if not takes_part else
           f"PASS: rdma moves data over {kind}, whose receiver takes part by design") if not problems \
    else "FAIL: " + "; ".join(problems)
if transport != "rdma":
    verdict += f" (DRY RUN over {transport}: this checks the script, not rdma)"
print("VERDICT: " + verdict)
sys.exit(1 if problems else 0)
EOF
