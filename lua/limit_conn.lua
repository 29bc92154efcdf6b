-- limit_conn.lua: nginx `limit_conn` for a whole fleet, as expiring leases.
--
-- Each zone's state for one client key is a sorted set of leases: member = lease id (unique per
-- request, "<instance>:<counter>"), score = the lease's expiry in ms. An admitted request holds a
-- lease in every conn zone of its route; the proxy renews it while the request runs and releases it
-- when the request ends, however it ends. A proxy that dies loses its leases when they expire:
-- a slot is never lost forever (nginx's counters leak when a worker crashes).
--
-- KEYS[i]  lease set of zone i: `<prefix>conn:<zone>:{<client key>}`.
-- ARGV[1]  mode: "acquire" | "renew" | "release" | "held"
-- ARGV[2]  now, integer ms since the Unix epoch; "" = use Redis TIME (one clock for the fleet)
-- ARGV[3]  lease TTL, ms
-- ARGV[4]  lease id
-- then, for "acquire" only, ARGV[4 + i] = max of zone i (nginx `limit_conn zone N`).
--
-- acquire: drops expired leases of every zone, then admits iff every zone holds fewer than its
--   max; if admitted, adds the lease to every zone (all or none, like nginx's rollback).
--   Reply: [1] admitted 0|1, [2] index of the first rejecting zone (0 if admitted),
--          then per zone the number of leases held before this request.
-- renew:   extends the lease in every zone where it still exists. Reply: zones where it was found.
-- release: removes the lease from every zone. Reply: zones it was removed from.
-- held:    writes nothing; per zone the number of unexpired leases (what "acquire" would report
--   as held). On a Redis Cluster, zones in different hash slots are acquired one slot per call;
--   once one slot rejects, the leases taken in earlier slots are released and the remaining slots
--   are only counted with "held", to report what one call would have (src/store/redis/limit_conn.rs).
-- Every write sets the set's TTL to the lease TTL, so an idle key vanishes with its last lease.
-- Only KEYS[] are touched.

local mode = ARGV[1]
local ttl = tonumber(ARGV[3])
local lease = ARGV[4]
if not ttl or ttl <= 0 or not lease or lease == '' then
  return redis.error_reply('limit_conn: ARGV[3] must be a positive TTL in ms and ARGV[4] a lease id')
end

local now
if ARGV[2] == '' then
  if redis.replicate_commands then
    pcall(redis.replicate_commands)
  end
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[2])
  if not now then
    return redis.error_reply('limit_conn: ARGV[2] is not a number of ms')
  end
end
local expiry = now + ttl

if mode == 'acquire' then
  if #ARGV ~= 4 + #KEYS then
    return redis.error_reply('limit_conn: acquire expects ' .. (4 + #KEYS) .. ' ARGV, got ' .. #ARGV)
  end
  local reply = { 1, 0 }
  for i = 1, #KEYS do
    redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
    local held = redis.call('ZCARD', KEYS[i])
    reply[2 + i] = held
    if reply[1] == 1 and held >= tonumber(ARGV[4 + i]) then
      reply[1] = 0
      reply[2] = i
    end
  end
  if reply[1] == 1 then
    for i = 1, #KEYS do
      redis.call('ZADD', KEYS[i], expiry, lease)
      redis.call('PEXPIRE', KEYS[i], ttl)
    end
  end
  return reply
elseif mode == 'renew' then
  local found = 0
  for i = 1, #KEYS do
    -- XX: only a lease that still exists is extended; an expired one is not resurrected, so a
    -- stalled proxy cannot push a zone over its max.
    if redis.call('ZADD', KEYS[i], 'XX', 'CH', expiry, lease) == 1 or redis.call('ZSCORE', KEYS[i], lease) then
      found = found + 1
      redis.call('PEXPIRE', KEYS[i], ttl)
    end
  end
  return found
elseif mode == 'held' then
  local reply = {}
  for i = 1, #KEYS do
    reply[i] = redis.call('ZCOUNT', KEYS[i], '(' .. string.format('%d', now), '+inf')
  end
  return reply
elseif mode == 'release' then
  local removed = 0
  for i = 1, #KEYS do
    removed = removed + redis.call('ZREM', KEYS[i], lease)
  end
  return removed
end
return redis.error_reply('limit_conn: unknown mode ' .. tostring(mode))
