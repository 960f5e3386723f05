#!/usr/bin/python3
"""Runs the SQL examples of a README and checks what their comments claim.

    python3 test/lib/readme_examples.py single README.md docs/*.md
    python3 test/lib/readme_examples.py nodes docs/nodes.md n1='host=... dbname=...' n2=...
    python3 test/lib/readme_examples.py list README.md docs/*.md   # what would run (no database)
    README_SECTIONS='Maps*' python3 test/lib/readme_examples.py single docs/maps.md   # some sections only

The convention (README.md and every page of docs/ follow it, this script
enforces it):

* Every `#`, `##` or `###` heading starts a section (`####` and deeper do
  not: such subsections share their section's database). What comes before
  the first heading is a section too, "(top)".
* Every fenced block whose info string starts with `sql` runs. `sql norun`
  blocks do not run and are reported as skipped, as are `go` and `java`
  blocks (no toolchain here). `sql node=NAME` blocks run only in `nodes`
  mode, on the session of node NAME, in document order across the whole
  file (each file given to `nodes` mode runs on its own sessions). Other blocks (sh, python, js, ...) are not this script's business
  (test/harness/clients.sh runs the Python and Node snippets).
* single mode (one or more files, in the order given, one TAP stream):
  each section's single-node blocks run in order in ONE psql
  session against a fresh database readme_<n> (created first, with
  `CREATE EXTENSION sharding` unless the section runs that itself: a copy
  of database readme_template, made once with the extension; dropped
  afterwards, together with any role the section created). The connection
  comes from PGHOST/PGPORT/PGUSER; the database `postgres` is used to create
  and drop the per-section databases.
* A statement ends at a `;` outside quotes, comments and dollar quotes (so
  multi-line statements, function bodies and BEGIN ... COMMIT work); a line
  starting with a backslash is a psql meta-command.
* `stmt;  -- → VALUE` checks the result: psql -XAt output, columns joined by
  `|`, rows joined by `, `; `...` in VALUE matches any text.
  `stmt;  -- ERROR 55000` (optionally `-- ERROR 55000: prose`) checks that the
  statement fails with that SQLSTATE. Any other comment is prose; every
  statement without a check must succeed.
* nodes mode only: a checked plain SELECT (calling nothing that changes
  state) whose value does not match yet is re-run every 0.2 s for up to
  README_SETTLE seconds (default 10), since followers apply the
  coordinator's changes asynchronously. single mode never re-runs anything.

Output is TAP: one line per checked statement, one per section ("every other
statement succeeded"), one `# SKIP` line per block that cannot run. The exit
status is non-zero when any check failed.
"""
import fnmatch
import os
import re
import secrets
import select
import subprocess
import sys
import threading
import time

TIMEOUT = float(os.environ.get('README_TIMEOUT', '120'))  # seconds per statement
# nodes mode: a checked read-only SELECT whose value does not match yet is
# re-run for up to this many seconds (followers apply changes asynchronously).
SETTLE = float(os.environ.get('README_SETTLE', '10'))
# Functions that change something: a statement calling one is never re-run.
MUTATING = re.compile(r'(?i)\b(create_map|drop_map|pin|unpin|move_shard|move_shard_online|rebalance|rebalance_by_load|'
                      r'add_node|drop_node|distribute|undistribute|attach_node|detach_node|isolate|claim\w*|complete|'
                      r'fail|extend_lease|enqueue\w*|advance|guard_rank|unguard_rank|create_queue|create_partitions|'
                      r'plproxy_install|fanout_reset|purge|set_\w+|nextval|setval|pg_advisory\w*|dblink\w*|'
                      r'pg_sleep\w*|insert_\w+|update_\w+|delete_\w+)\s*\(')
SKIP_LANGS = ('go', 'java')


# ---------------------------------------------------------------- parsing

class Block:
    def __init__(self, section, line, info, text):
        self.section = section      # Section
        self.line = line            # 1-based line of the first content line
        self.info = info
        self.text = text
        words = info.split()
        self.lang = words[0] if words else ''
        self.node = None
        self.norun = False
        for w in words[1:]:
            if w == 'norun':
                self.norun = True
            elif w.startswith('node='):
                self.node = w[len('node='):]

    @property
    def is_sql(self):
        return self.lang == 'sql'


class Section:
    def __init__(self, index, title, line):
        self.index = index      # per file; run_single numbers databases across files
        self.title = title
        self.line = line
        self.blocks = []


class Statement:
    def __init__(self, text, line, check=None, meta=False, error=None):
        self.text = text            # as sent to psql
        self.line = line            # README line where it starts
        self.check = check          # None | ('value', str) | ('error', sqlstate)
        self.meta = meta            # psql meta-command
        self.error = error          # a parse problem to report instead of running

    def short(self):
        s = ' '.join(l.strip() for l in strip_comments(self.text).splitlines() if l.strip())
        return s if len(s) <= 70 else s[:67] + '...'


FENCE = re.compile(r'^(\s{0,3})(`{3,}|~{3,})\s*(.*)$')
HEADING = re.compile(r'^(#{1,3})\s+(.*?)\s*#*\s*$')


def parse_readme(path):
    """Sections with their fenced blocks, in document order; README_SECTIONS
    (a shell pattern on section titles, for developers) keeps only some."""
    sections = _parse_readme(path)
    only = os.environ.get('README_SECTIONS')
    if only:
        for sec in sections:
            if not fnmatch.fnmatchcase(sec.title, only):
                sec.blocks = []
    return sections


def _parse_readme(path):
    lines = open(path, encoding='utf-8').read().split('\n')
    sections = [Section(0, '(top)', 1)]
    i = 0
    while i < len(lines):
        line = lines[i]
        m = FENCE.match(line)
        if m:
            fence, info = m.group(2), m.group(3).strip()
            body, start = [], i + 2
            i += 1
            while i < len(lines):
                c = lines[i].strip()
                if c.startswith(fence[0] * len(fence)) and c.strip(fence[0]) == '':
                    break
                body.append(lines[i])
                i += 1
            sections[-1].blocks.append(Block(sections[-1], start, info, '\n'.join(body)))
            i += 1
            continue
        h = HEADING.match(line)
        if h:
            sections.append(Section(len(sections), h.group(2), i + 1))
        i += 1
    return sections


def skip_token(sql, i):
    """Where the comment or quoted text starting at sql[i] ends (the index
    after it), or None if none starts there: -- and (nested) /* */ comments,
    'strings' (E'' with backslash escapes), "identifiers" and $tag$ dollar
    quotes. Unterminated ones run to the end."""
    n = len(sql)
    c = sql[i]
    if sql.startswith('--', i):
        j = sql.find('\n', i)
        return n if j < 0 else j
    if sql.startswith('/*', i):
        depth, j = 1, i + 2
        while j < n and depth:
            if sql.startswith('/*', j):
                depth, j = depth + 1, j + 2
            elif sql.startswith('*/', j):
                depth, j = depth - 1, j + 2
            else:
                j += 1
        return j
    if c in ("'", '"'):
        escapes = c == "'" and i > 0 and sql[i - 1] in 'eE' and (i < 2 or not (sql[i - 2].isalnum() or sql[i - 2] == '_'))
        j = i + 1
        while j < n:
            if escapes and sql[j] == '\\':
                j += 2
                continue
            if sql[j] == c:
                if j + 1 < n and sql[j + 1] == c:
                    j += 2
                    continue
                break
            j += 1
        return min(j + 1, n)
    if c == '$' and (i == 0 or not (sql[i - 1].isalnum() or sql[i - 1] == '_')):
        m = re.match(r'\$([A-Za-z_][A-Za-z_0-9]*)?\$', sql[i:])
        if m:
            tag = m.group(0)
            j = sql.find(tag, i + len(tag))
            return n if j < 0 else j + len(tag)
    return None


def strip_comments(sql):
    """The statement without -- and /* */ comments (for display and detection)."""
    out, i, n = [], 0, len(sql)
    while i < n:
        j = skip_token(sql, i)
        if j is None:
            out.append(sql[i])
            i += 1
            continue
        if not sql.startswith(('--', '/*'), i):
            out.append(sql[i:j])
        i = j
    return ''.join(out)


ANNOT = re.compile(r'^[ \t]*--[ \t]*(.*?)[ \t]*$')


def parse_check(comment):
    """('value', v) | ('error', code) | None for prose | ('bad', why)."""
    if comment.startswith('→'):
        return ('value', comment[1:].strip())
    if comment.startswith('ERROR'):
        m = re.match(r'^ERROR\s+([0-9A-Z]{5})(\s*(:.*)?)$', comment)
        if not m:
            return ('bad', 'malformed error check %r (want "-- ERROR 55000" or "-- ERROR 55000: prose")' % comment)
        return ('error', m.group(1))
    return None


def split_statements(block):
    """Statements of a block, with their checks and README line numbers."""
    sql = block.text
    n = len(sql)
    stmts = []
    buf_start = 0           # index where the current statement's text starts
    i = 0
    line_at = lambda pos: block.line + sql.count('\n', 0, pos)

    def only_blank_or_comments(s):
        return strip_comments(s).strip() == ''

    while i < n:
        c = sql[i]
        if c == '\\' and only_blank_or_comments(sql[buf_start:i]) and (i == 0 or sql[i - 1] == '\n' or sql[:i].split('\n')[-1].strip() == ''):
            # psql meta-command: to the end of the line
            j = sql.find('\n', i)
            j = n if j < 0 else j
            stmts.append(Statement(sql[i:j].strip(), line_at(i), meta=True))
            i = buf_start = j
            continue
        j = skip_token(sql, i)
        if j is not None:
            i = j
            continue
        if c == ';':
            text = sql[buf_start:i + 1]
            # where the statement really starts (skip blank lines and comments)
            lead = len(text) - len(text.lstrip())
            start = buf_start + lead
            eol = sql.find('\n', i)
            eol = n if eol < 0 else eol
            rest = sql[i + 1:eol]
            check, bad = None, None
            m = ANNOT.match(rest)
            if m:
                check = parse_check(m.group(1))
                if check and check[0] == 'bad':
                    bad, check = check[1], None
                i = eol
            else:
                i += 1
            body = text.strip()
            first = line_at(start)
            # leading comment lines are prose: report the line of the code
            for ln in body.split('\n'):
                if ln.strip() and not ln.strip().startswith('--'):
                    break
                first += 1
            if check is not None or bad or not only_blank_or_comments(text):
                stmts.append(Statement(body, first, check, error=bad))
            buf_start = i
            # a COPY ... FROM STDIN takes the following lines up to \.
            if re.match(r'(?is)^\s*copy\b.*\bfrom\s+stdin\b', strip_comments(body)):
                end = sql.find('\n\\.', i)
                if end >= 0:
                    stmts[-1].text += sql[i:end + 3]
                    i = buf_start = end + 3
            continue
        i += 1
    tail = sql[buf_start:]
    if not only_blank_or_comments(tail):
        stmts.append(Statement(tail.strip(), line_at(buf_start + len(tail) - len(tail.lstrip())),
                               error='statement not terminated by ";" (psql would not run it)'))
    return stmts


CREATE_EXT = re.compile(r'(?is)^\s*create\s+extension\s+(if\s+not\s+exists\s+)?"?sharding"?(\s|;|$)')


# ---------------------------------------------------------------- running

class Session:
    """One psql process driven through stdin, a marker after each statement."""

    def __init__(self, conninfo_args, env=None):
        self.marker = '@@readme-' + secrets.token_hex(8) + '@@'
        e = dict(os.environ)
        e.update(env or {})
        e['PGCLIENTENCODING'] = 'UTF8'
        self.proc = subprocess.Popen(
            ['psql', '-X', '-A', '-t', '-q', '-v', 'ON_ERROR_STOP=0', '-v', 'VERBOSITY=default',
             '-P', 'pager=off'] + conninfo_args,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=e)
        self.stderr = []
        self.buf = b''
        self.dead = None
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self):
        for line in iter(self.proc.stderr.readline, b''):
            self.stderr.append(line.decode('utf-8', 'replace'))

    def _readline(self, deadline):
        while b'\n' not in self.buf:
            left = deadline - time.time()
            if left <= 0:
                raise TimeoutError
            r, _, _ = select.select([self.proc.stdout], [], [], left)
            if r:
                chunk = os.read(self.proc.stdout.fileno(), 65536)
                if not chunk:
                    raise EOFError
                self.buf += chunk
        line, self.buf = self.buf.split(b'\n', 1)
        return line.decode('utf-8', 'replace')

    def run(self, stmt):
        """(ok, output lines, sqlstate, message, stderr text)."""
        if self.dead:
            return (False, [], None, self.dead, '')
        err_from = len(self.stderr)
        script = stmt.text + '\n'
        if not stmt.meta:
            script += '\\echo %s :ERROR :SQLSTATE :LAST_ERROR_MESSAGE\n' % self.marker
        else:
            script += '\\echo %s false 00000\n' % self.marker
        try:
            self.proc.stdin.write(script.encode('utf-8'))
            self.proc.stdin.flush()
            out = []
            deadline = time.time() + TIMEOUT
            while True:
                line = self._readline(deadline)
                if line.startswith(self.marker + ' '):
                    break
                out.append(line)
        except TimeoutError:
            self.dead = 'no answer within %gs (statement still running?)' % TIMEOUT
            self.close(kill=True)
            return (False, [], None, self.dead, ''.join(self.stderr[err_from:]))
        except (EOFError, BrokenPipeError):
            time.sleep(0.1)
            self.dead = 'psql exited: ' + ''.join(self.stderr[err_from:]).strip()
            return (False, [], None, self.dead, ''.join(self.stderr[err_from:]))
        parts = line[len(self.marker) + 1:].split(' ', 2)
        failed = parts[0] == 'true'
        sqlstate = parts[1] if len(parts) > 1 else ''
        message = parts[2] if len(parts) > 2 and failed else ''
        time.sleep(0)  # let the stderr thread catch up a little
        return (not failed, out, sqlstate, message, ''.join(self.stderr[err_from:]))

    def close(self, kill=False):
        try:
            if kill:
                self.proc.kill()
            else:
                self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except Exception:
            self.proc.kill()


class Tap:
    def __init__(self):
        self.n = 0
        self.failed = 0
        self.skipped = 0

    def ok(self, good, desc, diag=()):
        self.n += 1
        print('%s %d - %s' % ('ok' if good else 'not ok', self.n, desc))
        if not good:
            self.failed += 1
            for d in diag:
                for l in str(d).rstrip('\n').split('\n'):
                    print('#   ' + l)
        sys.stdout.flush()

    def skip(self, desc, why):
        self.n += 1
        self.skipped += 1
        print('ok %d - %s # SKIP %s' % (self.n, desc, why))
        sys.stdout.flush()

    def comment(self, text):
        print('# ' + text)
        sys.stdout.flush()

    def plan(self):
        print('1..%d' % self.n)


def value_matches(expected, got):
    pattern = '.*'.join(re.escape(p) for p in expected.split('...'))
    return re.fullmatch(pattern, got, re.S) is not None


class Checker:
    """Runs statements and reports the checks of a section."""

    def __init__(self, tap, section, where='', settle=0.0):
        self.settle = settle
        self.tap = tap
        self.section = section
        self.where = where
        self.problems = []      # failures of unannotated statements
        self.count = 0

    def label(self, stmt):
        return '%s: line %d%s: %s' % (self.section.title, stmt.line, self.where, stmt.short())

    def run(self, session, stmt, node=None):
        self.count += 1
        where = ' [%s]' % node if node else ''
        if stmt.error:
            self.tap.ok(False, self.label(stmt) + where, [stmt.error])
            return
        ok, out, sqlstate, message, err = session.run(stmt)
        got = ', '.join(out)
        if (self.settle > 0 and ok and stmt.check and stmt.check[0] == 'value'
                and not value_matches(stmt.check[1], got) and rereadable(stmt)):
            deadline, tries = time.time() + self.settle, 1
            while time.time() < deadline:
                time.sleep(0.2)
                ok, out, sqlstate, message, err = session.run(stmt)
                got, tries = ', '.join(out), tries + 1
                if not ok or value_matches(stmt.check[1], got):
                    break
            if ok and value_matches(stmt.check[1], got):
                self.tap.comment('line %d%s: matched after %d tries' % (stmt.line, where, tries))
        if stmt.check is None:
            if not ok:
                self.problems.append('line %d%s: %s\n  failed: %s %s' % (stmt.line, where, stmt.short(), sqlstate or '', message or err.strip()))
            return
        kind, want = stmt.check
        if kind == 'value':
            if not ok:
                self.tap.ok(False, self.label(stmt) + where + ' → ' + want,
                            ['expected: %s' % want, 'failed:   %s %s' % (sqlstate or '', message or err.strip())])
            else:
                self.tap.ok(value_matches(want, got), self.label(stmt) + where + ' → ' + want,
                            ['expected: %s' % want, 'got:      %s' % got])
        else:
            if ok:
                self.tap.ok(False, self.label(stmt) + where + ' fails with ' + want,
                            ['expected: ERROR %s' % want, 'but it succeeded: %s' % got])
            else:
                self.tap.ok(sqlstate == want, self.label(stmt) + where + ' fails with ' + want,
                            ['expected: ERROR %s' % want, 'got:      %s %s' % (sqlstate, message or err.strip())])

    def finish(self, extra=()):
        problems = list(extra) + self.problems
        if self.count or problems:
            self.tap.ok(not problems, '%s: every other statement succeeded%s' % (self.section.title, self.where), problems)


def rereadable(stmt):
    """A plain SELECT calling nothing that changes state: safe to run again."""
    text = strip_comments(stmt.text)
    return (not stmt.meta and re.match(r'(?is)^\s*(select|table|values)\b', text) is not None
            and not MUTATING.search(text) and not re.search(r'(?i)\b(into|for\s+update|for\s+share)\b', text))


def psql_admin(sql):
    r = subprocess.run(['psql', '-X', '-A', '-t', '-q', '-v', 'ON_ERROR_STOP=1', '-d', 'postgres', '-c', sql],
                       capture_output=True, text=True, env=dict(os.environ, PGCLIENTENCODING='UTF8'))
    return r.returncode == 0, r.stdout, r.stderr


def quote_ident(s):
    return '"' + s.replace('"', '""') + '"'


def roles():
    ok, out, _ = psql_admin('SELECT rolname FROM pg_catalog.pg_roles')
    return set(out.split('\n')) - {''} if ok else set()


def report_skips(tap, sections):
    for sec in sections:
        for b in sec.blocks:
            if b.is_sql and b.norun:
                tap.skip('%s: line %d: sql norun block' % (sec.title, b.line), 'not runnable here')
            elif b.lang in SKIP_LANGS:
                tap.skip('%s: line %d: %s block' % (sec.title, b.line, b.lang), 'not runnable here')


TEMPLATE = 'readme_template'


def make_template():
    """A database with the extension, copied for each section that does not
    create the extension itself (cheaper than CREATE EXTENSION each time).
    None (and every section creates the extension itself) if it fails."""
    psql_admin('DROP DATABASE IF EXISTS %s WITH (FORCE)' % TEMPLATE)
    ok, _, _ = psql_admin('CREATE DATABASE %s' % TEMPLATE)
    if not ok:
        return None
    r = subprocess.run(['psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', TEMPLATE, '-c', 'CREATE EXTENSION sharding'],
                       capture_output=True, text=True)
    if r.returncode != 0:
        psql_admin('DROP DATABASE IF EXISTS %s WITH (FORCE)' % TEMPLATE)
        return None
    return TEMPLATE


def file_sections(paths):
    """The sections of every file, in order. When several files are given,
    a section's title outside README.md starts with its file's name
    (docs/maps.md: ...)."""
    out = []
    for path in paths:
        for sec in parse_readme(path):
            if len(paths) > 1 and os.path.basename(path) != 'README.md':
                sec.title = '%s: %s' % (os.path.relpath(path), sec.title)
            out.append(sec)
    return out


def run_single(paths):
    tap = Tap()
    sections = file_sections(paths)
    node_blocks = 0
    template = None
    for number, sec in enumerate(sections):
        blocks = [b for b in sec.blocks if b.is_sql and not b.norun and b.node is None]
        node_blocks += sum(1 for b in sec.blocks if b.is_sql and not b.norun and b.node is not None)
        if not blocks:
            continue
        stmts = [s for b in blocks for s in split_statements(b)]
        if not stmts:
            continue
        db = 'readme_%d' % number
        own_extension = any(not s.meta and CREATE_EXT.match(strip_comments(s.text)) for s in stmts)
        if not own_extension and template is None:
            template = make_template() or ''
        before = roles()
        psql_admin('DROP DATABASE IF EXISTS %s WITH (FORCE)' % db)
        use_template = not own_extension and template
        ok, _, err = psql_admin('CREATE DATABASE %s%s' % (db, ' TEMPLATE ' + template if use_template else ''))
        checker = Checker(tap, sec)
        if not ok:
            checker.finish(['cannot create database %s: %s' % (db, err.strip())])
            continue
        setup = []
        if not own_extension and not use_template:
            setup.append(Statement('CREATE EXTENSION sharding;', sec.line))
        session = Session(['-d', db])
        extra = []
        for s in setup:
            ok, _, st, msg, err = session.run(s)
            if not ok:
                extra.append('setup: CREATE EXTENSION sharding failed: %s %s' % (st, msg or err))
        for s in stmts:
            checker.run(session, s)
        session.close()
        checker.finish(extra)
        psql_admin('DROP DATABASE IF EXISTS %s WITH (FORCE)' % db)
        for r in sorted(roles() - before - {'sharding_admin'}):
            psql_admin('DROP ROLE IF EXISTS %s' % quote_ident(r))
    if template:
        psql_admin('DROP DATABASE IF EXISTS %s WITH (FORCE)' % template)
    report_skips(tap, sections)
    if node_blocks:
        tap.comment('%d "sql node=NAME" block(s) left to the nodes mode (multi-node harness)' % node_blocks)
    tap.plan()
    return 1 if tap.failed else 0


def run_nodes(path, specs):
    tap = Tap()
    conns = {}
    for spec in specs:
        name, eq, conninfo = spec.partition('=')
        if not eq or not name:
            print('bad node argument %r (want NAME=CONNINFO)' % spec, file=sys.stderr)
            return 2
        conns[name] = conninfo
    sections = parse_readme(path)
    sessions = {}
    for sec in sections:
        blocks = [b for b in sec.blocks if b.is_sql and not b.norun and b.node is not None]
        if not blocks:
            continue
        checker = Checker(tap, sec, settle=SETTLE)
        extra = []
        for b in blocks:
            if b.node not in conns:
                extra.append('line %d: no connection given for node %s' % (b.line, b.node))
                continue
            if b.node not in sessions:
                sessions[b.node] = Session(['-d', conns[b.node]])
            for s in split_statements(b):
                checker.run(sessions[b.node], s, node=b.node)
        checker.finish(extra)
    for s in sessions.values():
        s.close()
    tap.plan()
    return 1 if tap.failed else 0


def run_list(path):
    for sec in file_sections([path]):
        for b in sec.blocks:
            if not b.is_sql and b.lang not in SKIP_LANGS:
                continue
            kind = 'skip' if (b.norun or not b.is_sql) else ('node=' + b.node if b.node else 'single')
            print('[%d] %s: line %d: %s %s' % (sec.index, sec.title, b.line, b.lang, kind))
            if b.is_sql:
                for s in split_statements(b):
                    chk = '' if s.check is None else ' {%s %s}' % s.check
                    print('    %d: %s%s%s' % (s.line, s.short(), chk, ' !! ' + s.error if s.error else ''))
    return 0


def main(argv):
    if len(argv) < 3 or argv[1] not in ('single', 'nodes', 'list'):
        print(__doc__, file=sys.stderr)
        return 2
    mode = argv[1]
    if mode == 'single':
        return run_single(argv[2:])
    if mode == 'nodes':
        return run_nodes(argv[2], argv[3:])
    for path in argv[2:]:
        run_list(path)
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
