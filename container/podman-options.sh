# Sourced by container/build.sh and check.sh: podman's options for this machine. Without
# systemd as PID 1 (a container, WSL2 without systemd, some CI machines) podman can neither
# ask systemd for a cgroup nor log its events to the journal: it manages the cgroups itself
# and writes its events to a file.
podman_options=()
if [ ! -d /run/systemd/system ]; then
  podman_options+=(--cgroup-manager=cgroupfs --events-backend=file)
fi
