"""RunLock (filelock): a folder held by another process is refused with its pid; the lock dies with its holder."""
import os
import subprocess
import sys
import textwrap

import pytest

from m3lab.errors import M3LabError
from m3lab.pipeline.run_folder import RunLock

HOLD = textwrap.dedent("""
    import sys, time
    from m3lab.pipeline.run_folder import RunLock
    with RunLock(sys.argv[1]):
        print("held", flush=True)
        time.sleep(60)
""")


def test_a_folder_held_by_another_process_is_refused_until_it_ends(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(M3LabError, match=f"in use by pid {proc.pid}"):
            with RunLock(tmp_path):
                pass
    finally:
        proc.kill()                                    # killed, not released: the kernel drops the lock
        proc.wait()
    with RunLock(tmp_path) as lock:
        assert lock.path.read_text() == str(os.getpid())


def test_released_on_exit_and_reusable(tmp_path):
    with RunLock(tmp_path):
        pass
    with RunLock(tmp_path):
        with pytest.raises(M3LabError, match="in use"):
            with RunLock(tmp_path):
                pass
