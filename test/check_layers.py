#!/usr/bin/env python3
"""The layers of src/ (docs/architecture.md, "Layers and topics of src/"),
checked by `make check-layers` (test/harness/layers.sh runs it).

--layers lists src/'s folders from the bottom up; folders of one layer are
joined by commas (peers: neither may include or call the other). A file may
include, and call, only its own folder and the layers below it:

- every #include "x/y.hpp" of src/ that names a file of src/ (PostgreSQL's
  own headers are the other includes) goes down the order, and the graph of
  which folder includes which has no cycle;
- with --objects, every call goes down too: each symbol an object file
  src/F/x.o leaves undefined and another src/G/y.o defines is a call from F
  to G (a forward declaration of another room's function, extern or not,
  is caught here, whatever the includes say). The roots (--roots: _PG_init
  and the aliases of the frozen scripts' symbols) are the module's entry
  points and may call every layer;
- no folder of src/ has the name of a PostgreSQL header folder (an include
  "nodes/x.h" must say whose it is);
- no folder holds more than a quarter of src/'s lines (*.cpp, *.hpp, *.h);
- no file is over --max-file lines and no function over --max-function
  lines (a function: from a line that starts at column 0 and ends with "{"
  to the next line that is "}" at column 0, as clang-format lays out this
  tree), except the functions listed in --known-long (file:function), each
  of which must still be long (the list only shrinks).

Prints one "ok - ..." or "not ok - ..." line per check; exits 1 if any
failed.
"""
import argparse
import os
import re
import subprocess
import sys


def src_files(src):
    out = []
    for d in sorted(os.listdir(src)):
        p = os.path.join(src, d)
        if not os.path.isdir(p):
            continue
        for f in sorted(os.listdir(p)):
            if f.endswith(('.cpp', '.hpp', '.h')):
                out.append(os.path.join(d, f))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--src', default='src')
    ap.add_argument('--layers', required=True)
    ap.add_argument('--roots', default='')  # files relative to --src
    ap.add_argument('--objects', action='store_true')
    ap.add_argument('--pg-includedir', default='')
    ap.add_argument('--max-file', type=int, default=1500)
    ap.add_argument('--max-function', type=int, default=150)
    ap.add_argument('--known-long', default='')
    a = ap.parse_args()

    level = {}
    for i, group in enumerate(a.layers.split()):
        for folder in group.split(','):
            level[folder] = i
    order = ' < '.join(a.layers.split())
    roots = set(a.roots.split())
    files = src_files(a.src)
    results = []

    def report(ok, what, bad):
        detail = '' if ok else ' (' + '; '.join(bad[:int(os.environ.get("LAYERS_SHOW", "12"))]) + ('; ...' if len(bad) > int(os.environ.get("LAYERS_SHOW", "12")) else '') + ')'
        results.append(ok)
        print(('ok' if ok else 'not ok') + ' - ' + what + detail)

    folders = sorted({f.split('/')[0] for f in files})
    unlisted = [f for f in folders if f not in level]
    report(not unlisted, 'every folder of %s/ has its place in the layer order %s' % (a.src, order),
           ['%s/ is in no layer' % f for f in unlisted])

    def may_use(src_folder, dst_folder):
        if src_folder == dst_folder:
            return True
        if src_folder not in level or dst_folder not in level:
            return False
        return level[dst_folder] < level[src_folder]

    # Includes.
    inc_re = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
    up, graph = [], {}
    for f in files:
        folder = f.split('/')[0]
        with open(os.path.join(a.src, f), encoding='utf-8', errors='replace') as fh:
            for n, line in enumerate(fh, 1):
                m = inc_re.match(line)
                if not m:
                    continue
                target = m.group(1)
                if not os.path.isfile(os.path.join(a.src, target)):
                    continue  # PostgreSQL's, or the system's
                tfolder = target.split('/')[0]
                if tfolder != folder:
                    graph.setdefault(folder, set()).add(tfolder)
                if not may_use(folder, tfolder):
                    up.append('%s/%s:%d includes %s' % (a.src, f, n, target))
    report(not up, 'every #include of a file of %s/ goes down the layer order %s' % (a.src, order), up)

    # Cycles between folders (depth-first search over the include graph).
    cycles, state = [], {}

    def visit(node, path):
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(' -> '.join(path[path.index(nxt):] + [nxt]) if nxt in path else nxt)
            elif state.get(nxt) is None:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if state.get(node) is None:
            visit(node, [node])
    report(not cycles, 'no include cycle between the folders of %s/' % a.src, cycles)

    # Calls, from the object files' symbols.
    if a.objects:
        defined, undefined, missing = {}, {}, []
        for f in files:
            if not f.endswith('.cpp'):
                continue
            obj = os.path.join(a.src, f[:-4] + '.o')
            if not os.path.isfile(obj):
                missing.append(obj)
                continue
            out = subprocess.run(['nm', obj], capture_output=True, text=True, check=True).stdout
            for line in out.splitlines():
                parts = line.split()
                if len(parts) == 3 and parts[1] in 'TDBR':
                    defined.setdefault(parts[2], f)
                elif len(parts) == 2 and parts[0] == 'U':
                    undefined.setdefault(f, set()).add(parts[1])
        calls_up = []
        for f, syms in sorted(undefined.items()):
            if os.path.join(a.src, f) in roots or f in roots:
                continue
            folder = f.split('/')[0]
            for s in sorted(syms):
                g = defined.get(s)
                if g is None:
                    continue
                if not may_use(folder, g.split('/')[0]):
                    name = subprocess.run(['c++filt', s], capture_output=True, text=True).stdout.strip()
                    calls_up.append('%s/%s calls %s of %s/%s' % (a.src, f, name.split('(')[0], a.src, g))
        calls_up = sorted(set(calls_up))
        report(not missing and not calls_up,
               'no call goes up the layer order (symbols of the object files of %s/)' % a.src,
               ['%s not built' % m for m in missing] + calls_up)

    # Shadowing.
    if a.pg_includedir:
        shadow = [f for f in folders if os.path.isdir(os.path.join(a.pg_includedir, f))]
        report(not shadow, 'no folder of %s/ has the name of a PostgreSQL header folder' % a.src,
               ['%s/%s/ shadows %s/%s/' % (a.src, f, a.pg_includedir, f) for f in shadow])

    # Sizes.
    lines = {}
    for f in files:
        with open(os.path.join(a.src, f), encoding='utf-8', errors='replace') as fh:
            lines[f] = fh.read().split('\n')
            if lines[f] and lines[f][-1] == '':
                lines[f].pop()
    total = sum(len(v) for v in lines.values())
    per_folder = {}
    for f, v in lines.items():
        per_folder[f.split('/')[0]] = per_folder.get(f.split('/')[0], 0) + len(v)
    big = ['%s/ %d of %d lines' % (d, n, total) for d, n in sorted(per_folder.items()) if 4 * n > total]
    report(not big, 'no folder of %s/ holds more than a quarter of its %d lines' % (a.src, total), big)

    long_files = ['%s/%s %d lines' % (a.src, f, len(v)) for f, v in sorted(lines.items()) if len(v) > a.max_file]
    report(not long_files, 'no file of %s/ is over %d lines' % (a.src, a.max_file), long_files)

    name_re = re.compile(r'([A-Za-z_][A-Za-z0-9_:~]*)\s*\(')
    known = set(a.known_long.split())
    long_fns, seen_known = [], set()
    for f, v in sorted(lines.items()):
        start = None
        for i, line in enumerate(v):
            if start is None:
                if line[:1] not in ('', ' ', '\t', '#', '/', '}', '{') and line.rstrip().endswith('{') \
                        and '(' in line and not line.startswith(('namespace', 'extern', 'struct', 'class', 'enum', 'union')):
                    start = i
                # a signature over several lines: its first line starts at column 0 and has the name
                elif line[:1] not in ('', ' ', '\t', '#', '/', '}', '{') and '(' in line and not line.rstrip().endswith((';', '{', '}')) \
                        and not line.startswith(('namespace', 'extern', 'struct', 'class', 'enum', 'union', 'template')):
                    j = i + 1
                    while j < len(v) and j < i + 8 and v[j][:1] in (' ', '\t') and not v[j].rstrip().endswith((';', '}')):
                        if v[j].rstrip().endswith('{'):
                            start = i
                            break
                        j += 1
            elif line == '}':
                n = i - start + 1
                m = name_re.search(v[start].split('=')[0] if '(' in v[start].split('=')[0] else v[start])
                fn = m.group(1) if m else v[start][:40]
                if fn in ('SHARDING_FUNCTION', 'PG_FUNCTION_INFO_V1'):
                    m2 = re.search(r'\(([A-Za-z0-9_]+)\)', v[start])
                    fn = m2.group(1) if m2 else fn
                key = '%s:%s' % (f, fn)
                if n > a.max_function:
                    if key in known:
                        seen_known.add(key)
                    else:
                        long_fns.append('%s/%s:%d %s %d lines' % (a.src, f, start + 1, fn, n))
                start = None
    report(not long_fns, 'no function of %s/ is over %d lines%s' % (
        a.src, a.max_function, ' but the listed %d (KNOWN_LONG)' % len(known) if known else ''), long_fns)
    if known:
        stale = sorted(known - seen_known)
        report(not stale, 'every function KNOWN_LONG lists is still over %d lines (the list only shrinks)' %
               a.max_function, ['%s is not (any more)' % k for k in stale])
    return 0 if all(results) else 1


if __name__ == '__main__':
    sys.exit(main())
