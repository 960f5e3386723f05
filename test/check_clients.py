#!/usr/bin/python3
"""Runs the client snippets of docs/hashing.md against the extension, emitting TAP.

The Python and Node snippets are extracted from docs/hashing.md (the fenced block
after `<!-- client: python -->` and `<!-- client: node -->`), so the page
shows exactly what is tested. Every key of test/vectors.csv plus generated
keys (non-ASCII text, random integers of every width, random uuids) is hashed
by the snippet and by the extension (hash64, shard_of over several n,
jump_shard for Python), and the answers must agree; the vectors' xxhsum
column must agree too. Node is skipped (TAP SKIP) when npm or the package
cannot be had. Needs /usr/bin/python3 with Debian's python3-xxhash, and PG*
environment variables naming a database with the extension.
"""
import csv, json, os, random, re, shutil, subprocess, sys, tempfile, uuid

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MOD_NS = [1, 2, 3, 7, 64, 480, 1000003, 2147483647]
JUMP_NS = [1, 5, 64, 100000, 2147483647]
NODE_PACKAGE = '@node-rs/xxhash@1'

def snippet(lang):
    text = open(os.path.join(ROOT, "docs", "hashing.md"), encoding='utf-8').read()
    m = re.search(r'<!-- client: %s -->\s*```\w*\n(.*?)\n```' % lang, text, re.S)
    return m.group(1) if m else None

def cases():
    """(type, sql expression, python key, node spec) for every key checked."""
    out = []
    with open(os.path.join(HERE, 'vectors.csv'), newline='') as f:
        for r in csv.DictReader(f):
            raw = bytes.fromhex(r['hex'])
            t = r['type']
            if t == 'text':
                key = raw.decode('utf-8')
                out.append((t, r['sql'], key, {'kind': 'text', 'value': key}))
            elif t == 'bytea':
                out.append((t, r['sql'], raw, {'kind': 'bytea', 'hex': r['hex']}))
            elif t == 'uuid':
                u = uuid.UUID(re.search(r"'([0-9a-f-]{36})'", r['sql']).group(1))
                out.append((t, r['sql'], u, {'kind': 'uuid', 'value': str(u)}))
            else:
                v = int(re.search(r'\((-?\d+)\)', r['sql']).group(1))
                out.append((t, r['sql'], v, {'kind': 'int', 'value': str(v)}))
    rng = random.Random(20261129)
    words = ['tenant-', 'ws_enterprise_', 'café-', 'Ölçü-', '東京-', '🐋-', 'order ', '']
    for i in range(60):
        s = rng.choice(words) + str(rng.randrange(10 ** rng.randrange(1, 12)))
        hx = s.encode('utf-8').hex()
        out.append(('text', f"convert_from('\\x{hx}'::bytea, 'UTF8')", s, {'kind': 'text', 'value': s}))
    for t, bits in (('smallint', 16), ('integer', 32), ('bigint', 64)):
        for _ in range(30):
            v = rng.randrange(-(1 << (bits - 1)), 1 << (bits - 1))
            out.append((t, f'({v})::{t}', v, {'kind': 'int', 'value': str(v)}))
    for _ in range(30):
        u = uuid.UUID(int=rng.getrandbits(128))
        out.append(('uuid', f"'{u}'::uuid", u, {'kind': 'uuid', 'value': str(u)}))
    for _ in range(20):
        b = bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 300)))
        out.append(('bytea', f"'\\x{b.hex()}'::bytea", b, {'kind': 'bytea', 'hex': b.hex()}))
    return out

def extension_answers(cs):
    selects = []
    for i, (_, sql, _, _) in enumerate(cs):
        k = f'({sql})'
        cols = [str(i), f'sharding.hash64({k})'] + [f'sharding.shard_of({k}, {n})' for n in MOD_NS]
        cols += [f'sharding.jump_shard({k}, {n})' for n in JUMP_NS]
        selects.append('SELECT ' + ', '.join(cols))
    res = subprocess.run(['psql', '-XAtq', '-v', 'ON_ERROR_STOP=1', '-F', '|'],
                         input='\nUNION ALL\n'.join(selects) + '\nORDER BY 1;',
                         capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f'not ok 1 - extension query failed: {res.stderr.strip()[:300]}')
    return [[int(x) for x in line.split('|')[1:]] for line in res.stdout.splitlines()]

class Tap:
    def __init__(self):
        self.n = 0
        self.failed = 0
    def ok(self, good, label, why=''):
        self.n += 1
        self.failed += 0 if good else 1
        print(f"{'ok' if good else 'not ok'} {self.n} - {label}" + ('' if good else f': {why}'))
    def skip(self, label, why):
        self.n += 1
        print(f'ok {self.n} - {label} # SKIP {why}')

def by_type(cs, got, want):
    """Per key type: (count, first disagreement or None)."""
    res = {}
    for (t, sql, _, _), g, w in zip(cs, got, want):
        n, bad = res.get(t, (0, None))
        if bad is None and g != w:
            bad = f'{sql[:50]}: snippet {g} != extension {w}'
        res[t] = (n + 1, bad)
    return res

def check_python(tap, cs, want):
    code = snippet('python')
    if code is None:
        tap.ok(False, 'docs/hashing.md has a python client snippet', 'no <!-- client: python --> block')
        return
    ns = {}
    try:
        exec(compile(code, 'docs/hashing.md python snippet', 'exec'), ns)
        tap.ok(True, "python snippet runs, its own asserts hold")
    except Exception as e:  # noqa: BLE001
        tap.ok(False, 'python snippet runs, its own asserts hold', repr(e))
        return
    got = [[ns['hash64'](key)] + [ns['shard_of'](key, n) for n in MOD_NS]
           + [ns['jump_shard'](key, n) for n in JUMP_NS] for (_, _, key, _) in cs]
    for t, (n, bad) in sorted(by_type(cs, got, want).items()):
        tap.ok(bad is None, f'python {t}: {n} keys agree with the extension '
               f'(hash64, shard_of over {len(MOD_NS)} n, jump_shard over {len(JUMP_NS)} n)', bad)
    try:
        ns['shard_of'](1.5, 4)
        tap.ok(False, 'python snippet refuses a float key', 'no TypeError')
    except TypeError:
        tap.ok(True, 'python snippet refuses a float key')

NODE_DRIVER = r'''
const c = require('./client.js');
const cases = JSON.parse(require('fs').readFileSync(0, 'utf8'));
const ns = JSON.parse(process.argv[2]);
const out = cases.map((k) => {
  const b = k.kind === 'text' ? c.textKey(k.value) : k.kind === 'int' ? c.intKey(BigInt(k.value))
          : k.kind === 'uuid' ? c.uuidKey(k.value) : c.byteaKey(Buffer.from(k.hex, 'hex'));
  return [c.hash64(b).toString()].concat(ns.map((n) => c.shardOf(b, n)));
});
process.stdout.write(JSON.stringify(out));
'''

def check_node(tap, cs, want):
    code = snippet('node')
    if code is None:
        tap.ok(False, 'docs/hashing.md has a node client snippet', 'no <!-- client: node --> block')
        return
    label = 'node snippet (@node-rs/xxhash) agrees with the extension'
    if not shutil.which('node') or not shutil.which('npm'):
        tap.skip(label, 'node or npm not installed')
        return
    with tempfile.TemporaryDirectory(prefix='sharding-node-') as d:
        try:
            r = subprocess.run(['npm', 'install', '--no-audit', '--no-fund', '--silent',
                                '--no-package-lock', NODE_PACKAGE], cwd=d, capture_output=True,
                               text=True, timeout=180)
        except subprocess.TimeoutExpired:
            r = None
        if r is None or r.returncode != 0:
            tap.skip(label, f'npm could not install {NODE_PACKAGE}')
            return
        open(os.path.join(d, 'client.js'), 'w').write(code + '\n')
        open(os.path.join(d, 'driver.js'), 'w').write(NODE_DRIVER)
        r = subprocess.run(['node', 'driver.js', json.dumps(MOD_NS)], cwd=d, capture_output=True,
                           text=True, input=json.dumps([spec for (_, _, _, spec) in cs]))
        if r.returncode != 0:
            tap.ok(False, 'node snippet runs', r.stderr.strip()[:300])
            return
        tap.ok(True, 'node snippet runs')
        got = [[int(x) for x in row] for row in json.loads(r.stdout)]
        for t, (n, bad) in sorted(by_type(cs, got, [w[:1 + len(MOD_NS)] for w in want]).items()):
            tap.ok(bad is None, f'node {t}: {n} keys agree with the extension '
                   f'(hash64, shard_of over {len(MOD_NS)} n)', bad)

def main():
    cs = cases()
    want = extension_answers(cs)
    tap = Tap()
    print('# keys checked: %d' % len(cs))
    # The vectors' oracle column (xxhsum) is what the extension returns too.
    with open(os.path.join(HERE, 'vectors.csv'), newline='') as f:
        rows = list(csv.DictReader(f))
    signed = lambda u: u - (1 << 64) if u >= 1 << 63 else u
    tap.ok(all(signed(int(r['xxh3'], 16)) == w[0] for r, w in zip(rows, want)),
           f'extension hash64 equals xxhsum for all {len(rows)} vectors')
    check_python(tap, cs, want)
    check_node(tap, cs, want)
    print(f'1..{tap.n}')
    return 1 if tap.failed else 0

if __name__ == '__main__':
    sys.exit(main())
