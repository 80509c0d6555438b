#!/usr/bin/env bash
# Builds the container image localhost/slotstream:latest without any registry: a minimal Debian
# bookworm root filesystem (debootstrap --variant=minbase) with slotstream's runtime libraries,
# ffmpeg for the H.264 worker, the slotstream binary and the workers, imported into podman.
#
# Needs root. Idempotent and cached:
#   build/image-rootfs/   the root filesystem (rebuilt only when the package list below changes;
#                         `make clean-image` deletes it)
#   the image itself      re-imported only when the binary, the workers or the rootfs changed
#                         (a content hash is kept in the image's label slotstream.content)
# Environment: IMAGE (default localhost/slotstream:latest), MIRROR (default: the mirror this host's
# apt uses for bookworm main — a site with its own mirror or proxy builds from it — and
# deb.debian.org only when apt names none).
set -euo pipefail
cd "$(dirname "$0")/../.."
image=${IMAGE:-localhost/slotstream:latest}
host_mirror() {
  apt-get indextargets --format '$(REPO_URI) $(RELEASE) $(COMPONENT) $(IDENTIFIER)' 2>/dev/null |
    awk '$2 == "bookworm" && $3 == "main" && $4 == "Packages" { sub("/$", "", $1); print $1; exit }'
}
mirror=${MIRROR:-$(host_mirror)}
mirror=${mirror:-http://deb.debian.org/debian}
rootfs=build/image-rootfs
t0=$SECONDS
say() { echo "image: $*"; }
die() { echo "image: error: $*" >&2; exit 1; }

# What workers and slotstream need at run time. ffmpeg brings libx264 (the H.264 worker).
packages=(coreutils ca-certificates ffmpeg libucx0 libnuma1 libspdlog1.10 libfmt9 libssl3 libstdc++6
          libprometheus-cpp-pull1.0 libprometheus-cpp-core1.0 libcivetweb1)
# Pulled in by ffmpeg's Depends but only used for GPU rendering, which a headless ffmpeg never
# loads (dlopen'ed DRI drivers and their LLVM): removed to save ~170 MB.
gpu_only=(libgl1-mesa-dri libllvm15 libz3-4)
recipe="bookworm minbase ${packages[*]} -${gpu_only[*]} v2"

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
ls workers/*.sh >/dev/null 2>&1 || die "no workers/*.sh to install"

# ---------------------------------------------------------------- the root filesystem (cached)
if [ "$(cat "$rootfs/.recipe" 2>/dev/null)" != "$recipe" ]; then
  say "debootstrap bookworm (minbase) into $rootfs from $mirror (1-3 minutes)"
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
  echo "$recipe" > "$rootfs/.recipe"
else
  say "root filesystem cached in $rootfs"
fi

# ---------------------------------------------------------------- slotstream and the workers
say "adding build/slotstream and workers/*.sh"
install -D -m 755 build/slotstream "$rootfs/usr/local/bin/slotstream"
rm -rf "$rootfs/opt/slotstream/workers"
install -d "$rootfs/opt/slotstream/workers"
install -m 755 workers/*.sh "$rootfs/opt/slotstream/workers/"
# A library the binary gained since the recipe was written: install its Debian package.
missing=$(chroot "$rootfs" ldd /usr/local/bin/slotstream | awk '/not found/{print $1}')
if [ -n "$missing" ]; then
  pkgs=$(for l in $missing; do dpkg -S "*/$l" 2>/dev/null | head -n 1 | cut -d: -f1; done | sort -u)
  [ -n "$pkgs" ] || die "slotstream needs $missing, which no installed Debian package provides; add it to build.sh"
  say "installing $pkgs into the image (needed by slotstream: $missing); add them to build.sh's packages"
  chroot "$rootfs" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive chroot "$rootfs" apt-get install -y -qq --no-install-recommends $pkgs >/dev/null
  chroot "$rootfs" apt-get clean; rm -rf "$rootfs"/var/lib/apt/lists/*
fi
chroot "$rootfs" /usr/local/bin/slotstream --version >/dev/null || die "slotstream does not run inside $rootfs"

# ---------------------------------------------------------------- import (skipped if unchanged)
content=$( (cat "$rootfs/.recipe"; sha256sum build/slotstream workers/*.sh) | sha256sum | cut -c1-16)
current=$(podman image inspect "$image" --format '{{index .Labels "slotstream.content"}}' 2>/dev/null || true)
if [ "$current" = "$content" ]; then
  say "$image is up to date (content $content)"
else
  old=$(podman image inspect "$image" --format '{{.Id}}' 2>/dev/null || true)
  say "importing $image (content $content)"
  # The receiver always passes --entrypoint /bin/sh ... -c COMMAND; CMD is for a bare `podman run`.
  tar -C "$rootfs" --exclude=./.recipe -c . | podman import -q \
    --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin' \
    --change 'WORKDIR /' \
    --change "LABEL slotstream.content=$content" \
    --change "LABEL org.opencontainers.image.revision=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
    --change 'CMD ["/usr/local/bin/slotstream", "--help"]' - "$image" >/dev/null
  new=$(podman image inspect "$image" --format '{{.Id}}')
  # The previous image would otherwise stay behind untagged (hundreds of MB per build).
  if [ -n "$old" ] && [ "$old" != "$new" ]; then podman rmi "$old" >/dev/null 2>&1 || true; fi
fi
podman --runtime runc run --rm --network none --ulimit nofile=20000:20000 --ulimit nproc=4096:4096 \
  "$image" /usr/local/bin/slotstream --version >/dev/null || die "$image does not start under podman"
size=$(podman image inspect "$image" --format '{{.Size}}')
say "$image ready: $((size / 1000000)) MB, $((SECONDS - t0)) s"
