"""``make test``'s normal-user phase runs under a throwaway account that is not root."""

import os
import subprocess
import sys

import pytest

from packlab.course import attendee_account


@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="no user ids on this platform")
def test_the_command_runs_under_an_account_that_is_not_root_and_cannot_read_roots_home(tmp_path):
    probe = ("import os, pathlib, torch, packlab.data; "
             "print('uid', os.getuid()); print('data', os.environ['PACKLAB_DATA']); "
             "print('cores', packlab.data.available_cores()); "
             "print('root_home_readable', os.access('/root', os.R_OK))")
    done = subprocess.run([sys.executable, "-m", "packlab.course.attendee_account", "--keep-env", "PACKLAB_VISIBLE_CORES",
                           "--", "python", "-c", probe], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PACKLAB_VISIBLE_CORES": "16"})
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines()[1:])
    assert done.stdout.startswith("the attendee's account: uid=")
    assert int(lines["uid"]) != 0  # grep-able proof: the account is not root
    assert lines["cores"] == "16"
    assert lines["data"].startswith("/") and "packlab-attendee-" in lines["data"]
    if os.geteuid() == 0:
        assert lines["root_home_readable"] == "False"
        account = done.stdout.splitlines()[0].split("(", 1)[1].split(")", 1)[0]  # uid=1001(packlab-attendee-42) ...
        assert account.startswith(attendee_account.ACCOUNT_PREFIX)
        # The account is gone afterwards (make test's normal-user phase may have one of its own meanwhile).
        assert subprocess.run(["getent", "passwd", account], capture_output=True).returncode == 2


def test_a_failing_command_gives_its_exit_status():
    done = subprocess.run([sys.executable, "-m", "packlab.course.attendee_account", "--", "python", "-c",
                           "raise SystemExit(3)"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 3
