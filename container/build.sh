#!/usr/bin/env bash
# make container: the course's OCI image (container/Containerfile), built from Debian's own
# archive and PyPI only. The base is made with mmdebstrap and imported into podman once, so no
# image is pulled from a container registry. Prints the build time and the image's size.
#   IMAGE=name:tag (default localhost/packed-course:latest), DEBIAN_MIRROR=url,
#   EXTRA_CA_BUNDLE=file: certificates of a network that inspects TLS, added to the image's store
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out="$root/_build/container"
base=localhost/packlab-debian:bookworm
image=${IMAGE:-localhost/packed-course:latest}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
source "$root/container/podman-options.sh"

for tool in podman mmdebstrap git; do
  if ! command -v "$tool" >/dev/null; then
    echo "make container: $tool is missing. On Debian or Ubuntu: sudo apt-get install podman mmdebstrap git" >&2
    exit 1
  fi
done
mkdir -p "$out"
start=$(date +%s)
if ! podman "${podman_options[@]}" image exists "$base"; then
  echo "the base image $base, from $mirror (mmdebstrap; once)"
  mmdebstrap --variant=minbase --include=python3,python3-venv,make,git,ca-certificates,procps \
    bookworm "$out/debian-bookworm.tar" "$mirror"
  podman "${podman_options[@]}" import --change 'CMD ["/bin/bash"]' "$out/debian-bookworm.tar" "$base"
  rm -f "$out/debian-bookworm.tar"
fi
# The committed course, as a clone has it: nothing of this checkout's environment, data or work.
rm -rf "$out/context"
mkdir -p "$out/context/course"
git -C "$root" archive HEAD | tar -x -C "$out/context/course"
mkdir -p "$out/context/extra-ca"
echo "certificates added to the image's store (EXTRA_CA_BUNDLE)" > "$out/context/extra-ca/README"
if [ -n "${EXTRA_CA_BUNDLE:-}" ]; then
  cp "$EXTRA_CA_BUNDLE" "$out/context/extra-ca/site.crt"
fi
podman "${podman_options[@]}" build "${podman_build_options[@]}" --tag "$image" --file "$root/container/Containerfile" "$out/context"
rm -rf "$out/context"
seconds=$(( $(date +%s) - start ))
size=$(podman "${podman_options[@]}" image inspect --format '{{.Size}}' "$image")
echo "built $image in $seconds s; $(( size / 1000000 )) MB"
echo "check it: make container-check; run it: podman run --rm -it --network=host --shm-size=2g $image"
