#!/usr/bin/env python3
"""Writes test/vectors.csv: shard-key test vectors whose hashes come from the
independent oracle `xxhsum -H3` (Debian package xxhash), never from our code.

Each row: type, sql (an SQL expression producing the key), hex (the key's
canonical bytes per docs/hashing.md, built here in Python), xxh3 (the
oracle's 64-bit hash of those bytes, hex). test/harness/vectors.sh re-runs
the oracle on every row and compares the extension against it.
"""
import csv, os, struct, subprocess, sys, tempfile, uuid

rows = []

def text(sql_literal_value, label=None):
    b = sql_literal_value.encode('utf-8')
    sql = "'" + sql_literal_value.replace("'", "''") + "'::text"
    rows.append(('text', sql, b.hex()))

def text_expr(sql, value):
    rows.append(('text', sql, value.encode('utf-8').hex()))

def bytea(b):
    rows.append(('bytea', "'\\x" + b.hex() + "'::bytea", b.hex()))

def integer(t, v):
    rows.append((t, f"({v})::{t}", struct.pack('<q', v).hex()))

def uid(s):
    u = uuid.UUID(s)
    rows.append(('uuid', f"'{s}'::uuid", u.bytes.hex()))

# text: empty, ASCII, multi-byte UTF-8, quotes, and XXH3's length classes
for s in ['', 'a', 'abc', 'tenant-42', 't007', "o'brien", 'ws_enterprise_42',
          'héllo wörld', '日本語のキー', '🐘 elephant', 'Ωmega', 'tab\there',
          '0123456789abcdef', '0123456789abcdefg']:
    text(s)
for n, ch in [(1, 'z'), (3, 'q'), (4, 'w'), (8, 'e'), (9, 'r'), (16, 'k'), (17, 'k'),
              (128, 'm'), (129, 'm'), (240, 'n'), (241, 'n'), (1000, 'p'), (4096, 'x'), (10000, 'y')]:
    text_expr(f"repeat('{ch}', {n})", ch * n)
text_expr("repeat('é', 100)", 'é' * 100)      # 200 bytes of UTF-8
text_expr("repeat('ab', 2048)", 'ab' * 2048)   # 4096 bytes, two letters

# bytea: empty, binary, zero bytes, length classes
bytea(b'')
bytea(b'\x00')
bytea(b'\x00\x00\x00\x00')
bytea(bytes(range(256)))
bytea(b'\xff' * 17)
bytea(bytes((i * 7) % 256 for i in range(129)))
bytea(bytes((i * 13 + 5) % 256 for i in range(241)))
bytea(bytes((i * 31) % 256 for i in range(4096)))
bytea('abc'.encode())

# integers: widened to int64, little-endian
for v in [0, 1, -1, 42, 255, 256, -32768, 32767]:
    integer('smallint', v)
for v in [0, 7, -7, 1000000, -2147483648, 2147483647]:
    integer('integer', v)
for v in [0, 1, -1, 42, 4294967296, -4294967297, -9223372036854775808, 9223372036854775807,
          1234567890123456789]:
    integer('bigint', v)

# uuid: 16 bytes in printed order
for s in ['00000000-0000-0000-0000-000000000000', 'ffffffff-ffff-ffff-ffff-ffffffffffff',
          '123e4567-e89b-12d3-a456-426614174000', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
          '00000000-0000-0000-0000-000000000001', 'f47ac10b-58cc-4372-a567-0e02b2c3d479']:
    uid(s)

def oracle(hexes):
    """xxhsum -H3 over each byte string; returns hex digests in order."""
    with tempfile.TemporaryDirectory() as d:
        paths = []
        for i, h in enumerate(hexes):
            p = os.path.join(d, f'{i:05d}.bin')
            with open(p, 'wb') as f:
                f.write(bytes.fromhex(h))
            paths.append(p)
        out = subprocess.run(['xxhsum', '-H3'] + paths, check=True, capture_output=True, text=True).stdout
    digests = {}
    for line in out.splitlines():
        # "XXH3 (path) = 78af5f94892f3950" (BSD style) or "hash  path"
        if line.startswith('XXH3 ('):
            path, digest = line[6:].rsplit(') = ', 1)
        else:
            digest, path = line.split(None, 1)
        digests[path.strip()] = digest.strip()[-16:]
    return [digests[p] for p in paths]

if __name__ == '__main__':
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), 'vectors.csv')
    digests = oracle([r[2] for r in rows])
    with open(out, 'w', newline='') as f:
        w = csv.writer(f)
        w.writerow(['type', 'sql', 'hex', 'xxh3'])
        for r, d in zip(rows, digests):
            w.writerow([r[0], r[1], r[2], d])
    print(f'{len(rows)} vectors written to {out}', file=sys.stderr)
