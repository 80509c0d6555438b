#!/usr/bin/env bash
# Builds the container image localhost/slotstream:latest without any registry: a minimal Debian
# root filesystem (debootstrap) with slotstream's runtime libraries, ffmpeg for the H.264
# worker, the slotstream binary and the example workers, imported into podman.
# Needs root. The root filesystem is cached in build/image-rootfs (delete it to rebuild).
set -euo pipefail
cd "$(dirname "$0")/../.."
image=${IMAGE:-localhost/slotstream:latest}
rootfs=build/image-rootfs
[ "$(id -u)" -eq 0 ] || { echo "image: needs root (debootstrap, podman import)" >&2; exit 1; }
need=()
for p in podman runc debootstrap; do command -v "$p" >/dev/null || need+=("$p"); done
if ((${#need[@]})); then
  echo "image: installing ${need[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc debootstrap >/dev/null
fi
[ -x build/slotstream ] || { echo "image: build slotstream first (bash scripts/build.sh)" >&2; exit 1; }
if [ ! -f "$rootfs/.complete" ]; then
  echo "image: debootstrap bookworm into $rootfs (about a minute)"
  rm -rf "$rootfs"
  debootstrap --variant=minbase --include=libucx0,ffmpeg,ca-certificates bookworm "$rootfs" >/dev/null
  chroot "$rootfs" apt-get clean
  rm -rf "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/var/lib/apt/lists/*
  touch "$rootfs/.complete"
fi
echo "image: adding slotstream and the workers"
install -D -m 755 build/slotstream "$rootfs/usr/local/bin/slotstream"
# Runtime libraries the binary links that minbase lacks (resolved on this build host).
for lib in $(ldd build/slotstream | awk '/=> \//{print $3}'); do
  [ -e "$rootfs$lib" ] || install -D -m 644 "$lib" "$rootfs$lib"
done
mkdir -p "$rootfs/opt/slotstream/workers"
install -m 755 workers/*.sh "$rootfs/opt/slotstream/workers/"
echo "image: importing $image"
tar -C "$rootfs" --exclude=./.complete -c . | podman import --change 'CMD ["/usr/local/bin/slotstream", "--help"]' - "$image" >/dev/null
podman --runtime runc run --rm --ulimit nofile=20000:20000 --ulimit nproc=4096:4096 "$image" /usr/local/bin/slotstream --version
echo "image: $image ready ($(podman image inspect "$image" --format '{{.Size}}') bytes)"
