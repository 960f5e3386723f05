#!/usr/bin/env python3
"""Checks the extension against test/vectors.csv, emitting TAP.

1. The oracle (`xxhsum -H3`) is run again over every row's canonical bytes
   and must reproduce the file's xxh3 column (the file was not edited by hand).
2. PostgreSQL's own functions (convert_to, int8send, uuid_send) turn each
   row's SQL expression into bytes, which must equal the row's hex column
   (the canonical bytes of docs/hashing.md).
3. sharding.hash64 / shard_of / jump_shard must equal values derived from the
   oracle's hash here in Python: signed reinterpretation, unsigned modulo, and
   an independent Lamping-Veach implementation.
Connection settings come from the usual PG* environment variables.
"""
import csv, os, subprocess, sys

sys.path.insert(0, os.path.dirname(__file__))
from gen_vectors import oracle  # noqa: E402

MOD_NS = [1, 2, 3, 7, 64, 128, 480, 1000003, 2147483647]
JUMP_NS = [1, 2, 5, 64, 480, 100000, 2147483647]

def jump(key, n):
    b, j = -1, 0
    while j < n:
        b = j
        key = (key * 2862933555777941757 + 1) & 0xFFFFFFFFFFFFFFFF
        j = int((b + 1) * (float(1 << 31) / float((key >> 33) + 1)))
    return b

def signed(u):
    return u - (1 << 64) if u >= 1 << 63 else u

def canonical_sql(t, expr):
    if t == 'text':
        return f"encode(convert_to({expr}, 'UTF8'), 'hex')"
    if t == 'bytea':
        return f"encode({expr}, 'hex')"
    if t == 'uuid':
        return f"encode(uuid_send({expr}), 'hex')"
    return f"encode(int8send(({expr})::bigint), 'hex')"  # big-endian; reversed below

def main():
    path = os.path.join(os.path.dirname(__file__), 'vectors.csv')
    with open(path, newline='') as f:
        rows = list(csv.DictReader(f))
    print(f'1..{len(rows) + 2}')
    digests = oracle([r['hex'] for r in rows])
    stale = [r['sql'][:40] for r, d in zip(rows, digests) if d != r['xxh3']]
    print(('ok' if not stale else 'not ok') + f' 1 - xxhsum reproduces all {len(rows)} stored hashes'
          + ('' if not stale else f' (differs: {stale[:3]})'))
    lengths = [len(r['hex']) // 2 for r in rows if r['type'] == 'text']
    classes = [0, 1, 16, 17, 128, 129, 240, 241, 4096]
    missing = [c for c in classes if c not in lengths]
    print(('ok' if not missing else 'not ok') + ' 2 - text vectors cover XXH3 length classes'
          + ('' if not missing else f' (missing {missing})'))

    selects = []
    for i, r in enumerate(rows):
        k = f"({r['sql']})"
        cols = [str(i), canonical_sql(r['type'], k), f'sharding.hash64({k})']
        cols += [f'sharding.shard_of({k}, {n})' for n in MOD_NS]
        cols += [f'sharding.jump_shard({k}, {n})' for n in JUMP_NS]
        selects.append('SELECT ' + ', '.join(cols))
    query = '\nUNION ALL\n'.join(selects) + '\nORDER BY 1'
    res = subprocess.run(['psql', '-XAtq', '-v', 'ON_ERROR_STOP=1', '-F', '|'], input=query + ';',
                         capture_output=True, text=True)
    if res.returncode != 0:
        for i in range(len(rows)):
            print(f'not ok {i + 3} - query failed: {res.stderr.strip()[:200]}')
        return 1
    out = [line.split('|') for line in res.stdout.splitlines()]
    failures = 0
    for i, (r, line) in enumerate(zip(rows, out)):
        h = int(r['xxh3'], 16)
        problems = []
        got_bytes = line[1]
        if r['type'] in ('smallint', 'integer', 'bigint'):
            got_bytes = bytes.fromhex(got_bytes)[::-1].hex()
        if got_bytes != r['hex']:
            problems.append('canonical bytes differ')
        if int(line[2]) != signed(h):
            problems.append(f'hash64 {line[2]} != {signed(h)}')
        for n, got in zip(MOD_NS, line[3:3 + len(MOD_NS)]):
            if int(got) != h % n:
                problems.append(f'shard_of n={n}: {got} != {h % n}')
        for n, got in zip(JUMP_NS, line[3 + len(MOD_NS):]):
            if int(got) != jump(h, n):
                problems.append(f'jump_shard n={n}: {got} != {jump(h, n)}')
        label = f"{r['type']} {r['sql'][:40]} ({len(r['hex']) // 2} bytes)"
        if problems:
            failures += 1
            print(f'not ok {i + 3} - {label}: ' + '; '.join(problems[:4]))
        else:
            print(f'ok {i + 3} - {label}')
    if len(out) != len(rows):
        print(f'# expected {len(rows)} result rows, got {len(out)}')
        return 1
    return 1 if failures or stale or missing else 0

if __name__ == '__main__':
    sys.exit(main())
