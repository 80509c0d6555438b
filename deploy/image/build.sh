#!/usr/bin/env bash
# Builds the container image localhost/slotstream:<VERSION> (also tagged :latest) without any
# registry: a minimal Debian bookworm root filesystem (debootstrap --variant=minbase) with every
# shared library build/slotstream needs, ffmpeg for the H.264 worker, the GStreamer plugin
# (build/gst/libgstslotstream.so: slotstreamsrc, slotstreamsink) with gst-launch-1.0, gst-inspect-1.0
# and the base plugins, the slotstream binary and the workers, imported into podman. The image is the receiver daemon: it runs `slotstream recv` as the
# unprivileged user 10001 by default (deploy/image/README.md).
#
# Needs root. Idempotent and cached:
#   build/image-rootfs/   the root filesystem (rebuilt only when its recipe changes: the package
#                         list, which includes the binary's own libraries; `make clean-image`
#                         deletes it)
#   the image itself      re-imported only when the binary, the workers or the rootfs changed
#                         (a content hash is kept in the image's label slotstream.content)
# Environment: IMAGE_REPO (default localhost/slotstream), MIRROR (default: the mirror this host's
# apt uses for bookworm main — a site with its own mirror or proxy builds from it — and
# deb.debian.org only when apt names none).
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=${IMAGE_REPO:-localhost/slotstream}
host_mirror() {
  apt-get indextargets --format '$(REPO_URI) $(RELEASE) $(COMPONENT) $(IDENTIFIER)' 2>/dev/null |
    awk '$2 == "bookworm" && $3 == "main" && $4 == "Packages" { sub("/$", "", $1); print $1; exit }'
}
mirror=${MIRROR:-$(host_mirror)}
mirror=${mirror:-http://deb.debian.org/debian}
rootfs=build/image-rootfs
uid=10001  # the daemon's user (numeric, so that Kubernetes' runAsNonRoot can check it)
t0=$SECONDS
say() { echo "image: $*"; }
die() { echo "image: error: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, chroot, podman import): sudo make image"
need=()
for p in podman runc debootstrap; do command -v "$p" >/dev/null || need+=("$p"); done
# catatonit: the `--init` of the worker's podman command line (deploy/image/README.md).
[ -x /usr/libexec/podman/catatonit ] || [ -x /usr/bin/catatonit ] || need+=(catatonit)
if ((${#need[@]})); then
  command -v apt-get >/dev/null || die "missing ${need[*]} and no apt-get to install them"
  say "installing ${need[*]} (apt)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
[ -x build/slotstream ] || die "build/slotstream is missing: build it first (bash scripts/build.sh)"
plugin=build/gst/libgstslotstream.so
[ -f "$plugin" ] || die "$plugin is missing: build it first (bash scripts/build.sh; needs libgstreamer1.0-dev)"
# Where the image's GStreamer finds plugins without GST_PLUGIN_PATH (Debian's, the same path in the rootfs).
gst_plugins=$(pkg-config --variable=pluginsdir gstreamer-1.0 2>/dev/null) \
  || die "pkg-config cannot find gstreamer-1.0 (libgstreamer1.0-dev; scripts/setup.sh installs it)"
ls workers/*.sh >/dev/null 2>&1 || die "no workers/*.sh to install"
command -v dpkg-query >/dev/null || die "the image's packages are found with dpkg: build on Debian 12 (bookworm)"
version=$(build/slotstream --version | awk '{print $2}')
[ -n "$version" ] || die "build/slotstream --version printed no version"

# ---------------------------------------------------------------- what the binary needs
# The Debian package of every shared library the binary and the GStreamer plugin link, and of the libraries of the UCX
# transport modules it loads at run time (rc/dc/ud: libibverbs, rdma-core's providers), found on
# this (bookworm) host with ldd + dpkg -S. Nothing is listed by hand, so a library the code gains
# is in the next image: the list is part of the rootfs recipe below.
package_of() {  # the package that owns a shared library path (usr-merged /lib or /usr/lib)
  local path=$1 real dir base owner
  real=$(readlink -f "$path")
  dir=$(readlink -f "$(dirname "$path")")
  base=$(basename "$path")
  for p in "$path" "$real" "$dir/$base" "${dir#/usr}/$base" "/usr${dir}/$base"; do
    owner=$(dpkg -S "$p" 2>/dev/null | head -n 1 | cut -d: -f1)
    [ -n "$owner" ] && { echo "$owner"; return 0; }
  done
  return 1
}
libraries_of() {  # resolved library paths of binaries/modules; dies on one ldd cannot find
  local out
  out=$(ldd "$@" 2>&1) || die "ldd $* failed: $out"
  if grep -q 'not found' <<<"$out"; then
    die "$(grep 'not found' <<<"$out" | sort -u | tr -s ' \t' ' ') — this host lacks a library slotstream links"
  fi
  awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// && $2 ~ /^\(/ {print $1}' <<<"$out" | sort -u
}
ucs=$(ldd build/slotstream | awk '$1 ~ /^libucs\.so/ {print $3}')
modules=()
[ -n "$ucs" ] && for m in "$(dirname "$(readlink -f "$ucs")")"/ucx/libuct_*.so.0; do [ -e "$m" ] && modules+=("$m"); done
libpackages=()
while read -r lib; do
  pkg=$(package_of "$lib") || die "no Debian package owns $lib (needed by build/slotstream or $plugin); install it from a package"
  libpackages+=("$pkg")
done < <(libraries_of build/slotstream "$plugin" "${modules[@]}")
mapfile -t libpackages < <(printf '%s\n' "${libpackages[@]}" | sort -u)

# The rest: workers and a shell. ffmpeg brings libx264 (the H.264 worker). gstreamer1.0-tools:
# gst-launch-1.0 and gst-inspect-1.0; gstreamer1.0-plugins-base: videotestsrc, videoconvert, the raw video caps a
# pipeline around slotstreamsink/slotstreamsrc needs (docs/gstreamer.md).
packages=(coreutils ca-certificates ffmpeg gstreamer1.0-tools gstreamer1.0-plugins-base "${libpackages[@]}")
# Pulled in by ffmpeg's Depends but only used for GPU rendering, which a headless ffmpeg never
# loads (dlopen'ed DRI drivers and their LLVM): removed to save ~170 MB. They are removed with
# --force-depends, which leaves apt unable to install anything afterwards, so every package the
# image needs is installed before (above), never after.
gpu_only=(libgl1-mesa-dri libllvm15 libz3-4)
for p in "${gpu_only[@]}"; do
  [[ " ${libpackages[*]} " == *" $p "* ]] && die "slotstream itself needs $p, which the slimming step removes"
done
recipe="bookworm minbase ${packages[*]} -${gpu_only[*]} v5"

# ---------------------------------------------------------------- the root filesystem (cached)
if [ "$(cat "$rootfs/.recipe" 2>/dev/null)" != "$recipe" ]; then
  say "debootstrap bookworm (minbase) into $rootfs from $mirror (1-3 minutes)"
  say "slotstream's libraries come from: ${libpackages[*]}"
  # An interrupted debootstrap (killed, timed out) leaves proc and sys mounted inside the root
  # filesystem, and rm -rf would fail on them (or reach into the host's /proc): unmount first.
  if [ -d "$rootfs" ]; then
    findmnt -rn -o TARGET | awk -v r="$(realpath "$rootfs")/" 'index($0 "/", r) == 1' | sort -r |
      while read -r m; do umount -l "$m" || die "cannot unmount $m inside $rootfs"; done
  fi
  rm -rf "$rootfs"
  mkdir -p "$rootfs/etc/dpkg/dpkg.cfg.d"
  # No documentation, man pages or translations, now or for anything installed later.
  printf '%s\n' 'path-exclude /usr/share/doc/*' 'path-include /usr/share/doc/*/copyright' \
    'path-exclude /usr/share/man/*' 'path-exclude /usr/share/info/*' \
    'path-exclude /usr/share/locale/*' 'path-include /usr/share/locale/locale.alias' \
    > "$rootfs/etc/dpkg/dpkg.cfg.d/01-slotstream-nodoc"
  log=build/image-debootstrap.log
  if ! debootstrap --variant=minbase --include="$(IFS=,; echo "${packages[*]}")" bookworm "$rootfs" "$mirror" \
       >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    die "debootstrap failed (full log: $log); is $mirror reachable?"
  fi
  say "slimming: removing ${gpu_only[*]}, apt caches, docs"
  chroot "$rootfs" dpkg --purge --force-depends "${gpu_only[@]}" >/dev/null 2>&1
  chroot "$rootfs" apt-get clean
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/log/*.log \
    "$rootfs"/var/cache/debconf/*-old "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/*
  find "$rootfs"/usr/share/doc -mindepth 1 -not -name copyright -not -type d -delete 2>/dev/null || true
  find "$rootfs"/usr/share/locale -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} + 2>/dev/null || true
  chroot "$rootfs" ffmpeg -hide_banner -v error -f lavfi -i testsrc=size=64x48 -frames:v 2 -c:v libx264 -f null - \
    || die "ffmpeg with libx264 does not run in $rootfs after slimming"
  # The daemon's user and its data directory (the default --out).
  # (Not below /data: a worker container sees exactly /data/device and /data/worker there.)
  echo "slotstream:x:$uid:$uid:slotstream daemon:/var/lib/slotstream:/usr/sbin/nologin" >> "$rootfs/etc/passwd"
  echo "slotstream:x:$uid:" >> "$rootfs/etc/group"
  install -d -o "$uid" -g "$uid" -m 755 "$rootfs/var/lib/slotstream" "$rootfs/var/lib/slotstream/streams"
  echo "$recipe" > "$rootfs/.recipe"
else
  say "root filesystem cached in $rootfs"
fi

# ---------------------------------------------------------------- slotstream and the workers
say "adding build/slotstream, $plugin and workers/*.sh"
install -D -m 755 build/slotstream "$rootfs/usr/local/bin/slotstream"
install -D -m 644 "$plugin" "$rootfs$gst_plugins/libgstslotstream.so"
rm -rf "$rootfs/opt/slotstream/workers"
install -d "$rootfs/opt/slotstream/workers"
install -m 755 workers/*.sh "$rootfs/opt/slotstream/workers/"
missing=$(chroot "$rootfs" ldd /usr/local/bin/slotstream | awk '/not found/{print $1}' | sort -u | tr '\n' ' ')
[ -z "$missing" ] || die "slotstream needs $missing, which the image lacks (a bug in this script's package list)"
chroot --userspec=$uid:$uid "$rootfs" /usr/local/bin/slotstream --version >/dev/null \
  || die "slotstream does not run inside $rootfs as user $uid"
missing=$(chroot "$rootfs" ldd "$gst_plugins/libgstslotstream.so" | awk '/not found/{print $1}' | sort -u | tr '\n' ' ')
[ -z "$missing" ] || die "the GStreamer plugin needs $missing, which the image lacks"
# (stderr kept for a failure only: the chroot has no /proc, and UCX says so while the plugin loads.)
for element in slotstreamsrc slotstreamsink; do
  out=$(chroot --userspec=$uid:$uid "$rootfs" env HOME=/tmp GST_REGISTRY=/tmp/gst-registry.bin \
    gst-inspect-1.0 "$element" 2>&1) || die "gst-inspect-1.0 $element fails inside $rootfs as user $uid: $out"
done
rm -f "$rootfs/tmp/gst-registry.bin"

# ---------------------------------------------------------------- import (skipped if unchanged)
image=$repo:$version
content=$( (cat "$rootfs/.recipe"; sha256sum build/slotstream "$plugin" workers/*.sh) | sha256sum | cut -c1-16)
current=$(podman image inspect "$image" --format '{{index .Labels "slotstream.content"}}' 2>/dev/null || true)
if [ "$current" = "$content" ]; then
  say "$image is up to date (content $content)"
else
  old=$(podman image inspect "$image" --format '{{.Id}}' 2>/dev/null || true)
  say "importing $image (content $content)"
  # The daemon by default; workers (recv --worker-runtime podman) pass --entrypoint /bin/sh.
  tar -C "$rootfs" --exclude=./.recipe -c . | podman import -q \
    --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin' \
    --change 'WORKDIR /var/lib/slotstream' \
    --change "USER $uid:$uid" \
    --change 'EXPOSE 7000/tcp' --change 'EXPOSE 9100/tcp' \
    --change 'STOPSIGNAL SIGTERM' \
    --change 'ENTRYPOINT ["/usr/local/bin/slotstream"]' \
    --change 'CMD ["recv", "--listen", "0.0.0.0:7000", "--out", "/var/lib/slotstream/streams", "--metrics", "0.0.0.0:9100"]' \
    --change "LABEL slotstream.content=$content" \
    --change "LABEL org.opencontainers.image.title=slotstream" \
    --change "LABEL org.opencontainers.image.version=$version" \
    --change "LABEL org.opencontainers.image.licenses=Apache-2.0" \
    --change "LABEL org.opencontainers.image.revision=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
    - "$image" >/dev/null
  new=$(podman image inspect "$image" --format '{{.Id}}')
  podman tag "$image" "$repo:latest"
  # The previous image would otherwise stay behind untagged (hundreds of MB per build).
  if [ -n "$old" ] && [ "$old" != "$new" ]; then podman rmi "$old" >/dev/null 2>&1 || true; fi
fi
podman tag "$image" "$repo:latest"  # also when the import was skipped but :latest moved
got=$(podman --runtime runc run --rm --network none --ulimit nofile=20000:20000 --ulimit nproc=4096:4096 \
  "$image" --version) || die "$image does not start under podman"
[ "$got" = "slotstream $version" ] || die "$image runs '$got', not slotstream $version"
size=$(podman image inspect "$image" --format '{{.Size}}')
say "$image (also $repo:latest) ready: $((size / 1000000)) MB, $((SECONDS - t0)) s"
