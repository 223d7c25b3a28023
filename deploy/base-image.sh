#!/usr/bin/env bash
# Makes a local Python 3.11 base image for machines that cannot pull one:
# Debian bookworm via debootstrap (its python3 is 3.11),
# with a venv on PATH as `python` so `python -m pip` works despite PEP 668.
# Usage: deploy/base-image.sh ENGINE TAG   e.g. podman localhost/python:3.11-bookworm
set -euo pipefail
engine=${1:-podman}
tag=${2:-localhost/python:3.11-bookworm}
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT

debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
  bookworm "$root" >/dev/null
chroot "$root" python3 -m venv /opt/python
ln -s /opt/python/bin/python "$root/usr/local/bin/python"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/root/.cache
tar -C "$root" -c . | "$engine" import \
  --change 'ENV PATH=/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["python3"]' - "$tag"
echo "base image: $tag"
