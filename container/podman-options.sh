# Sourced by container/build.sh and check.sh: podman's options for this machine.
# Without systemd as PID 1 (a container, WSL2 without systemd, some CI machines) podman can
# neither ask systemd for a cgroup nor log its events to the journal: it manages the cgroups
# itself and writes its events to a file.
podman_options=()
if [ ! -d /run/systemd/system ]; then
  podman_options+=(--cgroup-manager=cgroupfs --events-backend=file)
fi
# On a host with cgroups v1 and v2 mounted side by side ("hybrid", /sys/fs/cgroup/unified)
# crun, Debian's default runtime, refuses to create a container. The build's RUN steps then
# run with chroot isolation (no cgroup needed), and `podman run` without a cgroup of its own.
podman_build_options=()
podman_run_options=()
if [ -d /sys/fs/cgroup/unified ]; then
  podman_build_options+=(--isolation=chroot)
  podman_run_options+=(--cgroups=disabled)
fi
