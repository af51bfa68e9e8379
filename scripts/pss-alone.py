#!/usr/bin/env python3
"""The app's memory as if it ran alone: PSS with shared pages split only among the given processes.

The kernel's PSS splits a shared page among every process on the machine that maps it, so
another WebKitGTK app (or another engineer's e2e run) lowers our figure. This reads each
process's page map (root only) and divides every resident page by the number of mappings
of it within the given processes. Prints one line per process: pid, rss KiB, pss-alone KiB,
private KiB (pages only that process maps), and per process the top mappings by pss-alone
when --by-mapping is given.

Usage: pss-alone.py [--by-mapping N] PID...
"""
import collections
import os
import struct
import sys

PAGE = os.sysconf("SC_PAGE_SIZE")
CHUNK = 1 << 16  # pages per read of /proc/PID/pagemap


def mappings(pid):
    """(start, end, name) of every mapping with resident pages, from smaps."""
    out = []
    cur = None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split(None, 5)
            if "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
                start, end = (int(x, 16) for x in head[0].split("-"))
                name = head[5].strip() if len(head) > 5 else ""
                cur = [start, end, name or f"[anon {head[1]}]"]
            elif head[0] == "Rss:" and cur is not None and int(head[1]) > 0:
                out.append(tuple(cur))
    return out


def frames(pid):
    """{pfn: mapping name} for every resident page of the process."""
    result = {}
    with open(f"/proc/{pid}/pagemap", "rb") as pm:
        for start, end, name in mappings(pid):
            page = start // PAGE
            last = end // PAGE
            while page < last:
                n = min(CHUNK, last - page)
                pm.seek(page * 8)
                data = pm.read(n * 8)
                for i, (entry,) in enumerate(struct.iter_unpack("<Q", data)):
                    if entry >> 63 & 1:  # present in RAM
                        result.setdefault(entry & ((1 << 55) - 1), name)
                page += n
    return result


def main(argv):
    top = 0
    if argv and argv[0] == "--by-mapping":
        top = int(argv[1])
        argv = argv[2:]
    pids = [int(p) for p in argv]
    per = {pid: frames(pid) for pid in pids}
    if any(pfn == 0 for f in per.values() for pfn in f):
        sys.exit("pss-alone: page frame numbers are hidden (run as root)")
    count = collections.Counter(pfn for f in per.values() for pfn in f)
    for pid in pids:
        kib = PAGE // 1024
        alone = sum(1 / count[pfn] for pfn in per[pid]) * kib
        private = sum(1 for pfn in per[pid] if count[pfn] == 1) * kib
        print(f"{pid} {len(per[pid]) * kib} {int(alone)} {private}")
        if top:
            by = collections.Counter()
            for pfn, name in per[pid].items():
                by[name] += kib / count[pfn]
            for name, value in by.most_common(top):
                print(f"  {int(value):8d} KiB  {name}")


if __name__ == "__main__":
    main(sys.argv[1:])
