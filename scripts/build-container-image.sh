#!/usr/bin/env bash
# Build a small Debian image with Python for the container backend, without any registry:
# debootstrap fetches packages from a Debian mirror, `docker import` turns the tree into an image.
#   scripts/build-container-image.sh [tag] [suite] [mirror]
# Needs root, debootstrap (apt-get install debootstrap) and a reachable daemon (DOCKER_HOST honoured).
set -euo pipefail
tag=${1:-execspace-python:bookworm}
suite=${2:-bookworm}
mirror=${3:-http://deb.debian.org/debian}

rootfs=$(mktemp -d /tmp/execspace-rootfs.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT

debootstrap --variant=minbase --include=python3-minimal "$suite" "$rootfs" "$mirror"
# package caches and lists only make the image bigger: it never runs apt
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
chmod 1777 "$rootfs/tmp"  # the daemon copies this mode onto the container's tmpfs /tmp
tar -C "$rootfs" --numeric-owner -c . \
  | docker import --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' - "$tag"
echo "built $tag"
