"""measure.py KV_FILE LIMIT_S STDOUT STDERR -- CMD...: run CMD as the child
subreaper of what it starts, sample its process tree (count, summed PSS)
every 0.5 s, end whatever it left by pid, and append key values to KV_FILE.
Used by train_compare.sh."""
import os, subprocess, sys, time

from proctree import become_subreaper, descendants, end_below, pss_kib  # this folder is on sys.path

kv_path, limit, out_path, err_path = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
cmd = sys.argv[sys.argv.index("--") + 1:]
become_subreaper()
me = os.getpid()

def tree():
    """Pids below this launcher (the run and every orphan it left)."""
    return descendants(me, include_root=False)

started = time.monotonic()
with open(out_path, "wb") as so, open(err_path, "wb") as se:
    child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=so, stderr=se)
    peak_procs = peak_pss = 0
    timed_out = False
    while child.poll() is None:
        pids = tree()
        peak_procs = max(peak_procs, len(pids))
        peak_pss = max(peak_pss, sum(pss_kib(p) for p in pids))
        if time.monotonic() - started > limit:
            timed_out = True
            child.kill()
        time.sleep(0.5)
    wall = time.monotonic() - started
# Whatever the run left behind, by pid: TERM, then KILL after 5 s.
end_below(me, grace_s=5.0)
with open(kv_path, "a") as f:
    f.write(f"rc {124 if timed_out else child.returncode}\n")
    f.write(f"process_wall_s {wall:.3f}\n")
    f.write(f"peak_processes {peak_procs}\n")
    f.write(f"peak_pss_mib {peak_pss / 1024:.1f}\n")
    # The machine's 1-minute load at the end: a hint of other work during the run.
    f.write(f"loadavg_1m {open('/proc/loadavg').read().split()[0]}\n")