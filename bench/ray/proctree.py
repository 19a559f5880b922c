"""Process trees from /proc, for the benchmark scripts: which processes a
run consists of, how much memory they hold (PSS), and ending what a run
left behind, by pid."""
import ctypes
import os
import signal
import time


def become_subreaper():
    """Orphans of our children (Ray's daemons) are re-parented to us."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def descendants(root, include_root=True):
    """Pids of every process below `root` (and `root` itself unless
    include_root is false), read from /proc."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] == "Z":
            continue  # exited, waiting to be reaped
        children.setdefault(int(fields[1]), []).append(int(entry))
    tree, todo = ([root] if include_root else []), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            tree.append(child)
            todo.append(child)
    return tree


def pss_kib(pid):
    """A process's proportional set size in KiB (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def reap():
    """Collects every exited child without blocking."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def end_below(root, grace_s=5.0, log=None):
    """SIGTERM, then SIGKILL after `grace_s`, every process below `root`
    (not `root` itself), by pid."""
    pids = descendants(root, include_root=False)
    if pids and log:
        log(f"# ending {len(pids)} leftover processes: {pids}")
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while pids and time.monotonic() < deadline:
            reap()
            pids = descendants(root, include_root=False)
            if pids:
                time.sleep(0.1)
        if not pids:
            break
    reap()
