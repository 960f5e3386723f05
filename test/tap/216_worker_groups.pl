# Worker groups at work (docs/workers.md, CONTRACT 15.5): eight workers,
# each a background psql session running the worker loop of docs/workers.md
# (join, claim through claim_node, complete, heartbeat, join again when its
# lease was lost) as a role that is only a member of sharding_worker, on a
# map of 64 shards and 20,000 jobs over 2,000 keys, while the group changes:
# six start, a seventh and an eighth join, one leaves, and one dies (its psql
# client is killed; client_connection_check_interval ends its backend, so
# its lease simply stops being renewed). The library is preloaded, as in
# production.
#
# An audit trigger records every claim and completion (one sequence), and a
# trigger on sharding.worker_groups a snapshot of the owners and members at
# every redistribution. Checks: every job done exactly once; no key's jobs
# ever worked on by two workers at once (intervals [claim, completion], or
# [claim, lease expiry] for a claim that was never completed); the dead
# worker's shards dealt to the others only after its lease expired, and
# within a second of it (the delay is reported); its unfinished jobs taken
# over only once their claim leases expired; after every change the
# members' shard counts within one of each other, nobody else owning any,
# and exactly as many shards moved as the change required.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;
use QueueTest;
use Time::HiRes qw(time usleep);

my $jobs = 20000;
my $node = queue_node('worker_groups', 'jobs');
sub sql { return $node->safe_psql('postgres', $_[0]); }

sql(qq{
CREATE ROLE gworker IN ROLE sharding_worker;
SELECT sharding.create_map('gm', 64, ARRAY['seed']);
CREATE FUNCTION add_jobs(first integer, last integer) RETURNS void LANGUAGE sql AS \$\$
    INSERT INTO jobs (id, key, created)
    SELECT g, 'k' || (g * 7919 % 2000), '2026-01-01'::timestamptz + g * interval '1 millisecond'
      FROM generate_series(first, last) g
\$\$;
SELECT add_jobs(1, 8000);
ANALYZE jobs;
GRANT SELECT, UPDATE ON jobs TO gworker;

CREATE TABLE audit (
    seq bigserial PRIMARY KEY,
    job_id bigint NOT NULL,
    key text,
    event text NOT NULL,
    worker text,
    attempt integer,
    expires timestamptz,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE FUNCTION audit_jobs() RETURNS trigger LANGUAGE plpgsql AS \$\$
BEGIN
    IF NEW.status = 'processing' AND NEW.attempts IS DISTINCT FROM OLD.attempts THEN
        INSERT INTO public.audit (job_id, key, event, worker, attempt, expires)
        VALUES (NEW.id, NEW.key, 'claim', NEW.owner, NEW.attempts, NEW.claim_expires);
    ELSIF NEW.status = 'done' AND OLD.status <> 'done' THEN
        INSERT INTO public.audit (job_id, key, event, worker, attempt) VALUES (NEW.id, NEW.key, 'done', OLD.owner, NEW.attempts);
    END IF;
    RETURN NEW;
END \$\$;
CREATE TRIGGER audit AFTER UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION audit_jobs();
GRANT INSERT ON audit TO gworker;
GRANT USAGE ON SEQUENCE audit_seq_seq TO gworker;

-- The owners (by logical shard) and live members at every redistribution.
CREATE TABLE snaps (
    id bigserial PRIMARY KEY,
    generation bigint,
    owners text[] NOT NULL,
    members text[] NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
INSERT INTO snaps (generation, owners, members)
SELECT 0, array_agg(node ORDER BY logical), '{}' FROM sharding.shards WHERE map = 'gm';
CREATE FUNCTION snap() RETURNS trigger LANGUAGE plpgsql AS \$\$
BEGIN
    INSERT INTO public.snaps (generation, owners, members)
    SELECT NEW.generation,
           (SELECT pg_catalog.array_agg(s.node ORDER BY s.logical) FROM sharding.shards s WHERE s.map = NEW.map),
           (SELECT coalesce(pg_catalog.array_agg(m.worker ORDER BY m.worker), '{}') FROM sharding.worker_members m
             WHERE m.map = NEW.map);
    RETURN NULL;
END \$\$;
CREATE TRIGGER snap AFTER UPDATE OF generation ON sharding.worker_groups FOR EACH ROW EXECUTE FUNCTION snap();

CREATE TABLE ctl (worker text PRIMARY KEY);   -- workers told to leave ('*': no more jobs come)
CREATE TABLE slow (worker text PRIMARY KEY);  -- workers that hold each batch 1 s
GRANT SELECT ON slow TO gworker;
CREATE TABLE rejoins (worker text, at timestamptz DEFAULT clock_timestamp());
GRANT SELECT ON ctl TO gworker;
GRANT INSERT ON rejoins TO gworker;

-- The worker loop of docs/workers.md, with the audit's needs: join; then
-- heartbeat every 250 ms (join again if the lease was lost), claim a
-- batch through claim_node (commit), work 2 ms (1 s for a worker in table
-- slow), complete it (commit); leave when told to, or when the queue is
-- drained once the test has added its last jobs.
CREATE PROCEDURE gwork(me text, seconds integer) LANGUAGE plpgsql AS \$\$
DECLARE
    ids bigint[];
    beat timestamptz := clock_timestamp();
    t0 timestamptz := clock_timestamp();
    lost boolean := false;
BEGIN
    PERFORM sharding.join('gm', me, '3 seconds');
    COMMIT;
    LOOP
        IF clock_timestamp() - beat > interval '250 milliseconds' THEN
            BEGIN
                PERFORM sharding.heartbeat('gm', me);
            EXCEPTION WHEN object_not_in_prerequisite_state THEN
                lost := true;
            END;
            IF lost THEN
                PERFORM sharding.join('gm', me, '3 seconds');
                INSERT INTO public.rejoins (worker) VALUES (me);
                lost := false;
            END IF;
            beat := clock_timestamp();
            COMMIT;
        END IF;
        SELECT array_agg(c.id) INTO ids FROM sharding.claim_node(NULL::jobs, 'gm', me, me, 20, '5 seconds') c;
        COMMIT;
        IF ids IS NOT NULL THEN
            PERFORM pg_sleep(CASE WHEN EXISTS (SELECT FROM public.slow WHERE worker = me) THEN 1 ELSE 0.002 END);
            PERFORM sharding.complete('jobs', ids, me);
            COMMIT;
        ELSE
            EXIT WHEN NOT EXISTS (SELECT FROM jobs WHERE status IN ('pending', 'processing'))
                  AND EXISTS (SELECT FROM public.ctl WHERE worker = '*');
            PERFORM pg_sleep(0.02);
        END IF;
        EXIT WHEN clock_timestamp() - t0 > seconds * interval '1 second'
               OR EXISTS (SELECT FROM public.ctl WHERE worker = me);
    END LOOP;
    PERFORM sharding.leave('gm', me);
END \$\$;
});

sub start_worker
{
	my ($w) = @_;
	my ($h) = start_workers($node, 'postgres', qq{
SET client_connection_check_interval = '100ms';
SET application_name = '$w';
SET ROLE gworker;
CALL gwork('$w', 300);
});
	return $h;
}
sub member { return "SELECT count(*) FROM sharding.group_members WHERE worker = '$_[0]'" }
sub done { return "SELECT count(*) >= $_[0] FROM audit WHERE event = 'done'" }

my $t0 = time;
my %w = map { ("w$_" => start_worker("w$_")) } 1 .. 6;
ok(defined sharding_wait($node, 'postgres', done(3000), 't', 120), 'six workers: 3,000 jobs done');
$w{w7} = start_worker('w7');
ok(defined sharding_wait($node, 'postgres', member('w7'), '1', 60), 'w7 joined');
ok(defined sharding_wait($node, 'postgres', done(6000), 't', 120), '6,000 jobs done');
# The jobs come in three parts, each added once the test has seen what it
# waits for: the workers' pace never decides whether work is left for the
# next step (eight workers once drained all 20,000 jobs in under 2 s, before
# w8 was told to slow down; it left with the others and held nothing when
# killed). The second part comes once w8 is a member and owns its shards:
# added before, seven workers once drained it from the shards they still
# owned before w8's join dealt it any, and w8 found nothing to do.
$w{w8} = start_worker('w8');
ok(defined sharding_wait($node, 'postgres', "SELECT count(*) > 0 FROM sharding.shards WHERE map = 'gm' AND node = 'w8'", 't', 60),
	'w8 joined and owns shards');
sql('SELECT add_jobs(8001, 14000)');
ok(defined sharding_wait($node, 'postgres', "SELECT count(*) > 0 FROM audit WHERE worker = 'w8' AND event = 'done'", 't', 60),
	'w8 works');
sql("INSERT INTO ctl VALUES ('w3')");
ok(defined sharding_wait($node, 'postgres', member('w3'), '0', 60), 'w3 left');
my ($w3_rc) = sharding_finish(delete $w{w3});
is($w3_rc, 0, 'w3 ended normally');
ok(defined sharding_wait($node, 'postgres', done(12000), 't', 120), '12,000 jobs done');

# w8 dies: its client is killed while it works (it holds each batch for a
# second from now on, so that it certainly holds one when killed: the last
# jobs come after it is told, and only w8 claims those of its shards).
sql("INSERT INTO slow VALUES ('w8')");
sql("SELECT add_jobs(14001, $jobs); INSERT INTO ctl VALUES ('*')");
ok(defined sharding_wait($node, 'postgres', "SELECT count(*) > 0 FROM jobs WHERE owner = 'w8' AND status = 'processing'", 't', 30),
	'w8 holds a batch');
$w{w8}{h}->signal('KILL');
my $killed = time;
my $w8 = delete $w{w8};
sharding_finish($w8);
my $w8_status = $w8->{h}->full_result(0) // -1;
is($w8_status & 127, 9, "w8's client was killed (wait status $w8_status)");
ok(defined sharding_wait($node, 'postgres', "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'w8'", '0', 10),
	"w8's backend ended with its client");
my $w8_expires = sql("SELECT extract(epoch FROM lease_expires) FROM sharding.worker_members WHERE worker = 'w8'");
my $w8_shards = sql("SELECT count(*) FROM sharding.shards WHERE map = 'gm' AND node = 'w8'");
ok($w8_expires ne '' && $w8_shards > 0, "w8 still holds $w8_shards shards under its lease");
my $w8_held = sql("SELECT coalesce(array_agg(id ORDER BY id), '{}') FROM jobs WHERE owner = 'w8' AND status = 'processing'");
ok(defined sharding_wait($node, 'postgres', "SELECT count(*) FROM sharding.shards WHERE map = 'gm' AND node = 'w8'", '0', 30),
	"w8's shards were dealt to the others");

my ($failed, @results) = finish_workers(values %w);
my $elapsed = sprintf('%.0f', time - $t0);
is($failed, 0, 'the other workers ended normally') or diag(join('', map { $_->[2] } @results));

# The deal that took w8 out.
my ($dealt, $dealt_gen) = split /\|/, sql("SELECT extract(epoch FROM at), generation FROM snaps
                                            WHERE NOT 'w8' = ANY (members) AND id > (SELECT max(id) FROM snaps WHERE 'w8' = ANY (members))
                                            ORDER BY id LIMIT 1");
my $after = int(($dealt - $w8_expires) * 1000);
cmp_ok($after, '>=', 0, "w8's shards were dealt only after its lease expired");
cmp_ok($after, '<', 1000, "... and within 1 s of it ($after ms after; killed " . int(($w8_expires - $killed) * 1000)
	. " ms before its lease expired)");
diag("w8 killed; its $w8_shards shards dealt ${after} ms after its lease expired (lease 3 s, heartbeats every 250 ms, generation $dealt_gen)");

is(sql("SELECT count(*) = $jobs AND bool_and(status = 'done') FROM jobs"), 't', "all $jobs jobs are done (${elapsed}s)");
is(sql("SELECT count(*) = $jobs AND count(DISTINCT job_id) = $jobs FROM audit WHERE event = 'done'"), 't',
	'every job was completed exactly once');

# Intervals of work: [claim, completion of that attempt], or, for a claim
# never completed (w8's), [claim, first event after its lease expired].
sql(q{
CREATE INDEX ON audit (job_id, event, attempt);
CREATE INDEX ON audit (at);
CREATE TABLE spans AS
SELECT c.job_id, c.key, c.worker, c.attempt, c.seq AS s, c.expires,
       coalesce((SELECT d.seq FROM audit d WHERE d.job_id = c.job_id AND d.event = 'done' AND d.attempt = c.attempt),
                (SELECT min(x.seq) FROM audit x WHERE x.at >= c.expires), 9223372036854775807) AS e,
       EXISTS (SELECT FROM audit d WHERE d.job_id = c.job_id AND d.event = 'done' AND d.attempt = c.attempt) AS finished
  FROM audit c WHERE c.event = 'claim';
CREATE INDEX ON spans (key);
});
my $overlaps = sql("SELECT count(*) FROM spans a JOIN spans b ON a.key = b.key AND a.worker < b.worker
                     WHERE a.s < b.e AND b.s < a.e");
is($overlaps, '0', "no key's jobs were ever worked on by two workers at once ($overlaps overlapping pairs)");
my $unfinished = sql("SELECT count(*) FROM spans WHERE NOT finished");
is(sql("SELECT count(*) FROM spans WHERE NOT finished AND worker <> 'w8'"), '0',
	"only w8's claims were never completed ($unfinished of them)");
is(sql("SELECT count(*) = cardinality('$w8_held'::bigint[]) FROM spans s
         WHERE s.job_id = ANY ('$w8_held') AND s.worker <> 'w8' AND s.finished
           AND (SELECT x.at FROM audit x WHERE x.seq = s.s) >= (SELECT max(o.expires) FROM spans o WHERE o.job_id = s.job_id AND o.worker = 'w8')"),
	't', "w8's unfinished jobs ($w8_held) were taken over by others only after their claim leases expired");

# Every change: balanced within one, nobody else owns a shard, and as few
# moves as the change needs.
my @snaps = map { [ split /\|/ ] } split /\n/,
  sql("SELECT id, array_to_string(owners, ','), array_to_string(members, ',') FROM snaps ORDER BY id");
my ($bad_balance, $bad_moves, $changes, $moved_total) = (0, 0, 0, 0);
for my $i (1 .. $#snaps)
{
	my @before = split /,/, $snaps[ $i - 1 ][1];
	my @after = split /,/, $snaps[$i][1];
	my @members = split /,/, ($snaps[$i][2] // '');
	my %m = map { $_ => 1 } @members;
	my (%cb, %ca);
	$cb{$_}++ for @before;
	$ca{$_}++ for @after;
	my $k = @members;
	my $q = int(64 / $k);
	my $r = 64 % $k;
	# Balanced: members own q or q + 1 (r of them q + 1), others nothing.
	my $ok = 1;
	for my $n (keys %ca) { $ok = 0 unless $m{$n} && ($ca{$n} == $q || $ca{$n} == $q + 1); }
	$ok = 0 if (grep { ($ca{$_} // 0) == $q + 1 } @members) != $r;
	$bad_balance++ unless $ok;
	# Fewest moves: the r members owning most keep q + 1, the rest q.
	my @by = sort { ($cb{$b} // 0) <=> ($cb{$a} // 0) } @members;
	my $kept = 0;
	for my $j (0 .. $#by) { my $t = $j < $r ? $q + 1 : $q; my $c = $cb{ $by[$j] } // 0; $kept += $c < $t ? $c : $t; }
	my $moved = grep { $before[$_] ne $after[$_] } 0 .. 63;
	$bad_moves++ if $moved != 64 - $kept;
	$changes++;
	$moved_total += $moved;
	diag("change $i: members " . join(',', @members) . ": moved $moved (needed " . (64 - $kept) . ")");
}
cmp_ok($changes, '>=', 10, "$changes redistributions were recorded (6 joins, 2 more, a leave, a death, the end)");
is($bad_balance, 0, 'after every change the members own within one shard of each other, nobody else any');
is($bad_moves, 0, "every change moved exactly as many shards as it required ($moved_total moves in all)");
my $rejoins = sql("SELECT count(*) FROM rejoins");
diag("$elapsed s for $jobs jobs; $rejoins rejoins after a lost lease");
done_testing();
