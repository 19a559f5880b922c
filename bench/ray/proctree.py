"""Process trees from /proc, for the benchmark scripts: which processes a
run consists of, and how much memory they hold (PSS)."""
import os


def descendants(root, include_root=True):
    """Pids of every process below `root` (and `root` itself unless
    include_root is false), read from /proc."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
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
