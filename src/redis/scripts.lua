-- Shared prelude of botmesh's Redis scripts (prepended to each script in redis.rs).
-- Keys of one chat share the hash tag {<chat>} so that a script touches one slot:
--   h  holder:  STRING t NUL k NUL pr NUL pk (ticket, token, previous replica and
--               token); PX = the lease
--   q  queue:   LIST of tickets in arrival order
--   w  waiting: HASH replica -> alive-until (server time, us) of that replica's tickets
--               in this chat, refreshed by its renewals (one field per replica, so a
--               deep queue costs the renewal tick nothing more)
--   l  last:    STRING k NUL r (last token and replica); PX = history
--   m  claim:   STRING the message id's claimant ticket, or "!" and the ticket that
--               handled it (so a retried release after a lost reply is recognised)
-- A ticket is "<seq>:<replica>". Times are Redis TIME in microseconds. Every
-- redis.call costs about a microsecond, so the uncontended paths make few.
-- Redis Cluster rule: while a chat's slot is being migrated, the source node runs a
-- script only if every declared key is there (else TRYAGAIN or ASK, which the client
-- retries), and fails any call on a key that is missing, aborting the script midway
-- with its earlier writes kept. So a script never touches a key again after it
-- deleted or emptied it (release overwrites the holder instead of deleting it
-- first; settle pops the queue at most its length).
local SEP = '\0'
local function split(s)
  local out, i = {}, 1
  while true do
    local j = string.find(s, SEP, i, true)
    if not j then
      out[#out + 1] = string.sub(s, i)
      return out
    end
    out[#out + 1] = string.sub(s, i, j - 1)
    i = j + 1
  end
end
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function num(x) return string.format('%.0f', x) end
local function replica_of(t)
  local i = string.find(t, ':', 1, true)
  return string.sub(t, i + 1)
end
-- The holder as {t, k, pr, pk}, or nil.
local function holder(h)
  local v = redis.call('GET', h)
  if not v then return nil end
  return split(v)
end
-- Records a grant of the chat to ticket t with a lease of `lease` ms; publishes it
-- to t's replica unless keep(t, replica). Returns {t, k, pr, pk, replica}.
-- The token is max(last + 1, server time in us). Tokens never run ahead of the clock
-- (a grant takes far more than a microsecond), so the time alone exceeds every earlier
-- token when the chat's history expired, was lost in a restart, or is stale because
-- Redis came back from an older snapshot or a lagging replica.
local function grant(h, l, chat, t, now, lease, hist, wake, keep)
  local pr, pk = '', ''
  local token = now or now_us()
  local last = redis.call('GET', l)
  if last then
    local p = split(last)
    pk, pr = p[1], p[2] or ''
    local n = tonumber(pk)
    if n and n + 1 > token then token = n + 1 end
  end
  local r = replica_of(t)
  local k = num(token)
  redis.call('SET', h, t .. SEP .. k .. SEP .. pr .. SEP .. pk, 'PX', lease)
  redis.call('SET', l, k .. SEP .. r, 'PX', hist)
  if not keep(t, r) then
    redis.call('PUBLISH', wake .. r, cjson.encode({c = chat, t = t, k = k, pr = pr, pk = pk}))
  end
  return {t, k, pr, pk, r}
end
-- Hands a free chat (the caller checked h is absent) to the first live ticket in the
-- queue, skipping lapsed ones. Returns the grant or nil.
local function settle(h, q, w, l, chat, ttl, hist, wake, keep)
  local now = nil
  -- Popped at most as many times as it holds: the pop that empties the list deletes
  -- it, and touching a deleted key again fails the script midway while its slot is
  -- being migrated (see the header).
  for _ = 1, redis.call('LLEN', q) do
    local t = redis.call('LPOP', q)
    if not t then return nil end
    local alive = tonumber(redis.call('HGET', w, replica_of(t)))
    now = now or now_us()
    if alive and alive > now then
      -- The grantee's own liveness bounds its lease, not the caller's TTL: replicas
      -- may run different TTLs (a rolling deploy), and alive-until was set from the
      -- grantee's TTL at its last renewal, so the lease never outlives a crashed
      -- grantee by more than its own TTL, nor lapses before it can renew. A grant the
      -- caller answers with (keep) is the caller's own, and the caller is alive: it
      -- gets a full TTL from now, which the caller counts from its call's send time.
      local r = replica_of(t)
      local lease = ttl
      if not keep(t, r) then lease = math.floor((alive - now) / 1000) end
      if lease < 1 then lease = 1 end
      return grant(h, l, chat, t, now, lease, hist, wake, keep)
    end
  end
  return nil
end
-- The holder of the chat, after handing a free chat on; a grant to ticket t itself is
-- not published (the caller answers with it).
local function holder_or_settle(h, q, w, l, chat, t, ttl, hist, wake)
  local hv = holder(h)
  if hv then return hv end
  local g = settle(h, q, w, l, chat, ttl, hist, wake, function(x) return x == t end)
  if g then return {g[1], g[2], g[3], g[4]} end
  return nil
end
-- Extends a key's expiry to at least ms, never shortening it: a replica with a short
-- TTL must not cut the queue of a waiter with a long one. (A key without expiry, just
-- created, gets one.)
local function extend(k, ms)
  if redis.call('PEXPIRE', k, ms, 'GT') == 0 and redis.call('PTTL', k) == -1 then
    redis.call('PEXPIRE', k, ms)
  end
end
local function touch(q, w, ttl)
  extend(q, 3 * ttl)
  extend(w, 3 * ttl)
end
local function never() return false end
