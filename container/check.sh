#!/usr/bin/env bash
# make container-check: in the image, as its normal account (attendee): the doctor, then
# chapter 1 executed from its first cell to its last, as an attendee's Run All would.
#   CONTAINER_RUN=chroot: the same commands in the image's files through chroot, for a host
#   where the runtime cannot start a container at all (one that refuses the resource limits
#   podman sets: a sandbox whose root lacks CAP_SYS_RESOURCE). Root only; says so when used.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
image=${IMAGE:-localhost/packed-course:latest}
source "$root/container/podman-options.sh"
commands='set -e
  echo "as $(id -un) (uid $(id -u)), in $(pwd)"
  make doctor
  .venv/bin/jupytext --to ipynb --execute --output /tmp/01_jpeg_files.ipynb chapters/01_jpeg_files.md
  echo "chapter 1: every cell ran"'
start=$(date +%s)
if [ "${CONTAINER_RUN:-podman}" = chroot ]; then
  echo "CONTAINER_RUN=chroot: the image's files, run with chroot as attendee, not by a container runtime"
  container=$(podman "${podman_options[@]}" create "$image")
  files=$(podman "${podman_options[@]}" mount "$container")
  cleanup() {
    for point in dev/shm dev proc; do umount "$files/$point" 2>/dev/null || true; done
    podman "${podman_options[@]}" rm --force "$container" >/dev/null
  }
  trap cleanup EXIT
  mount --bind /proc "$files/proc"
  mount --bind /dev "$files/dev"
  mount -t tmpfs -o size=2g tmpfs "$files/dev/shm"
  chroot --userspec=attendee:attendee "$files" env -i HOME=/home/attendee USER=attendee LANG=C.UTF-8 \
    PATH=/usr/local/bin:/usr/bin:/bin bash -c "cd /home/attendee/packed-course && $commands"
else
  podman "${podman_options[@]}" run "${podman_run_options[@]}" --rm --shm-size=2g --user attendee "$image" \
    bash -c "$commands"
fi
echo "container check passed in $(( $(date +%s) - start )) s"
