#!/usr/bin/env bash
# `execspace image build` does this from an installed package (docs/backends.md "Images, offline"); this script is
# the same image for a checkout without one. A small Debian image with Python for the container backend, no registry:
# debootstrap fetches packages from a Debian mirror, `docker import` turns the tree into an image.
#   scripts/build-container-image.sh [tag] [suite] [mirror]
# Needs root, debootstrap (apt-get install debootstrap) and a reachable daemon (DOCKER_HOST honoured; Docker or
# Podman's Docker-compatible socket).
set -euo pipefail
tag=${1:-execspace-python:bookworm}
suite=${2:-bookworm}
mirror=${3:-http://deb.debian.org/debian}

rootfs=$(mktemp -d /tmp/execspace-rootfs.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT

# python3, not python3-minimal: environments' packages need its whole standard library (asyncio, contextvars...)
debootstrap --variant=minbase --include=python3 "$suite" "$rootfs" "$mirror"
# package caches and lists only make the image bigger: it never runs apt
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
chmod 1777 "$rootfs/tmp"  # the daemon copies this mode onto the container's tmpfs /tmp
tar -C "$rootfs" --numeric-owner -c . \
  | docker import --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' \
      --change 'LABEL execspace.languages=python,bash' - "$tag"  # what the backend may run code blocks with
# Podman's Docker-compatible import (4.3) ignores the tag and names the image <repo>:latest: tag it
if ! docker image inspect "$tag" >/dev/null 2>&1; then
  docker tag "${tag%%:*}:latest" "$tag"
fi
echo "built $tag"
