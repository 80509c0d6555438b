# Convenience targets; the build itself is CMake (scripts/build.sh).
.PHONY: image clean-image
image:
	bash scripts/build.sh
	bash deploy/image/build.sh
clean-image:
	rm -rf build/image-rootfs
	-podman rmi -f $$(podman images -q localhost/slotstream)
