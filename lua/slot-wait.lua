-- slot-wait: records a shard as waiting for a server's slots when the state is split into shards
-- (pipeline/state/calls.py), after one of its jobs parked for want of one. A shard not waiting yet
-- goes first, as a tenant that was idle is served at the next turn, not after every backlog; a shard
-- waiting already keeps its turn.
--
-- keys: 1
-- KEYS[1] the shards waiting for the server's slots (zset: shard number -> turn)
--
-- ARGV[1] the shard's number
--
-- Returns {0 OK, 1 recorded | 0 waiting already}

if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return {0, 0} end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
redis.call('ZADD', KEYS[1], (tonumber(first[2]) or 1) - 1, ARGV[1])
return {0, 1}
