
-- Queue (docs/queue.md): enqueue_many writes status
-- 'pending' and checks the columns it writes (22023); wake-ups cut a key
-- too long for NOTIFY (sharding._notify_payload, new) instead of failing
-- the insert.

-- @replace sharding.enqueue_many

-- @include sharding._notify_payload

-- @replace sharding._queue_notify

-- Ordered claims: a round's pick and the UPDATE (src/queue/queue_ordered.cpp).
-- @replace sharding._claim_ordered_sql
