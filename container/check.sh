#!/usr/bin/env bash
# make container-check: in the image, as its normal account (attendee): the doctor, then
# chapter 1 executed from its first cell to its last, as an attendee's Run All would.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
image=${IMAGE:-localhost/packed-course:latest}
source "$root/container/podman-options.sh"
start=$(date +%s)
podman "${podman_options[@]}" run --rm --shm-size=2g --user attendee "$image" bash -c '
  set -e
  echo "as $(id -un) (uid $(id -u)), in $(pwd)"
  make doctor
  .venv/bin/jupytext --to ipynb --execute --output /tmp/01_jpeg_files.ipynb chapters/01_jpeg_files.md
  echo "chapter 1: every cell ran"'
echo "container check passed in $(( $(date +%s) - start )) s"
