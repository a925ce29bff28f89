"""Notebook kernels that exit the way JupyterLab ends them: a pytest plugin for ``make test``'s nbval phases.

nbval ends each notebook's kernel with ``shutdown_kernel(now=True)``: jupyter_client then
sends SIGKILL to the kernel's whole process group, which holds the kernel, its DataLoader
workers and multiprocessing's resource tracker. Nothing they registered to undo at exit is
undone: MDS's six ``/dev/shm`` names per dataset (removed by an ``atexit`` handler),
multiprocessing's semaphores (``/dev/shm/sem.mp-…``, removed by the resource tracker). A
day of test runs left about 1,800 of them on the test machine, and MDS, which looks for a
free name by walking the existing ones, grew slower with each.

JupyterLab's "Shut Down Kernel" (and nbclient, which ``make grade`` uses) asks first: a
``shutdown_request``, then SIGTERM and SIGKILL only if the kernel has not exited within
``shutdown_wait_time``. This plugin makes nbval do the same, so a test run leaves what an
attendee's session leaves, and a kernel whose exit hangs costs seconds, not a leak.
"""

from __future__ import annotations


def pytest_configure(config):
    from nbval.kernel import RunningKernel

    def stop(self):
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)  # a shutdown_request: the kernel runs its atexit handlers
        del self.km

    RunningKernel.stop = stop
