#!/usr/bin/env python3
"""Helpers of scripts/startup-order.sh: which functions of a binary ran while it started.

  evict BIN                      drop BIN's pages from the page cache
  touched BIN OUT [PREV]         the text functions on pages of BIN now in the page cache
                                 (only those also in the list PREV), in address order
  interleave BIN LIST G OUT      an ordering of LIST in groups of G, each group followed by
                                 at least 4 KiB of functions not in LIST, so that a page read
                                 at start names one group
  union LIST MORE OUT            LIST, then the names of MORE it does not hold
"""
import ctypes
import mmap
import os
import re
import subprocess
import sys

PAGE = 4096


def text_section(path):
    """(address, file offset, size) of .text."""
    out = subprocess.run(["readelf", "-SW", path], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        m = re.match(r"\s*\[\s*\d+\]\s+\.text\s+\S+\s+([0-9a-f]+)\s+([0-9a-f]+)\s+([0-9a-f]+)", line)
        if m:
            return tuple(int(g, 16) for g in m.groups())
    sys.exit("no .text section in " + path)


def functions(path):
    """(address, size, name) of the binary's functions with a size."""
    out = subprocess.run(["nm", "--defined-only", "-S", path], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[2] in "tTwW" and int(parts[1], 16) > 0:
            found.append((int(parts[0], 16), int(parts[1], 16), parts[3]))
    if not found:
        sys.exit("no symbols in %s: is it stripped?" % path)
    return found


def cached_pages(path):
    """Indexes of the file's pages in the page cache (mincore of a shared mapping)."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    fd = os.open(path, os.O_RDONLY)
    size = os.fstat(fd).st_size
    addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    pages = (size + PAGE - 1) // PAGE
    vec = (ctypes.c_ubyte * pages)()
    if libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) != 0:
        sys.exit("mincore failed: errno %d" % ctypes.get_errno())
    return [i for i in range(pages) if vec[i] & 1]


def evict(path):
    fd = os.open(path, os.O_RDONLY)
    # Pages not yet written back (a binary the linker has just written) are not dropped:
    # they would all read as "read at start".
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    left = len(cached_pages(path))
    if left > 16:
        sys.exit("%s: %d pages still in the page cache after the drop (mapped elsewhere?)" % (path, left))


def touched(path, out, prev=None):
    keep = set(open(prev).read().split()) if prev else None
    vaddr, offset, size = text_section(path)
    pages = {(i * PAGE - offset + vaddr) // PAGE for i in cached_pages(path)
             if offset - PAGE < i * PAGE < offset + size}
    names, code, seen = [], 0, set()
    for start, length, name in sorted(functions(path)):
        if not vaddr <= start < vaddr + size or name in seen:
            continue
        if keep is not None and name not in keep:
            continue
        if any(p in pages for p in range(start // PAGE, (start + length - 1) // PAGE + 1)):
            seen.add(name)
            names.append(name)
            code += length
    with open(out, "w") as f:
        f.write("\n".join(names) + "\n")
    print("%d functions, %d KiB of code, on %d KiB of text pages read" % (len(names), code // 1024, len(pages) * 4))


def interleave(path, listed, group, out):
    wanted = open(listed).read().split()
    wanted_set = set(wanted)
    # The largest functions not listed first, so the blocks are few functions each.
    others = sorted(((length, name) for _, length, name in functions(path) if name not in wanted_set), reverse=True)
    blocks, block, size = [], [], 0
    for length, name in others:
        block.append(name)
        size += length
        # More than a page, with room for the functions' alignment.
        if size >= PAGE + 64:
            blocks.append(block)
            block, size = [], 0
    groups = [wanted[i:i + group] for i in range(0, len(wanted), group)]
    if len(blocks) < len(groups):
        print("note: %d groups but %d blocks; the last groups share pages" % (len(groups), len(blocks)))
    lines = []
    for i, members in enumerate(groups):
        lines += members
        if i < len(blocks):
            lines += blocks[i]
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")


def union(listed, more, out):
    names = open(listed).read().split()
    known = set(names)
    added = [n for n in open(more).read().split() if n not in known]
    with open(out, "w") as f:
        f.write("\n".join(names + added) + "\n")
    print("%d functions added" % len(added))


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    if command == "evict":
        evict(*args)
    elif command == "touched":
        touched(*args)
    elif command == "union":
        union(*args)
    elif command == "interleave":
        interleave(args[0], args[1], int(args[2]), args[3])
    else:
        sys.exit(__doc__)
