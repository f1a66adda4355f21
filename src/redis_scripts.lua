-- Shared prelude of botmesh's Redis scripts (prepended to each script below).
-- Keys of one chat share the hash tag {<chat>} so a script touches one slot:
--   h  holder:   HASH t=ticket k=token r=replica pr=previous replica pk=previous token; PX = lease
--   q  queue:    LIST of tickets in arrival order
--   w  waiting:  HASH ticket -> alive-until (server time, us); kept fresh by renewals
--   l  last:     HASH k=last token r=last replica; PX = history
--   m  claim:    STRING ticket of the message id's claimant, or "!" once handled; PX = dedup window
-- A ticket is "<seq>:<replica>". Times are Redis TIME in microseconds.
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function num(x) return string.format('%.0f', x) end
local function replica_of(t)
  local i = string.find(t, ':', 1, true)
  return string.sub(t, i + 1)
end
local function holder(h)
  local v = redis.call('HMGET', h, 't', 'k', 'pr', 'pk')
  return v
end
-- Hands a free chat to the first live ticket; returns {ticket, token, prev_r, prev_k, replica}
-- or nil. Publishes the grant to its replica unless `keep(ticket, replica)` says the
-- caller takes it from the reply.
local function settle(h, q, w, l, chat, ttl, hist, wake, keep)
  if redis.call('EXISTS', h) == 1 then return nil end
  local now = now_us()
  while true do
    local t = redis.call('LPOP', q)
    if not t then return nil end
    local alive = tonumber(redis.call('HGET', w, t))
    redis.call('HDEL', w, t)
    if alive and alive > now then
      local last = redis.call('HMGET', l, 'k', 'r')
      local token = now
      local pk = tonumber(last[1])
      if pk and pk + 1 > token then token = pk + 1 end
      local r = replica_of(t)
      local lease = math.floor((alive - now) / 1000)
      if lease > ttl then lease = ttl end
      if lease < 1 then lease = 1 end
      local pr = last[2] or ''
      local pks = last[1] or ''
      redis.call('HSET', h, 't', t, 'k', num(token), 'r', r, 'pr', pr, 'pk', pks)
      redis.call('PEXPIRE', h, lease)
      redis.call('HSET', l, 'k', num(token), 'r', r)
      redis.call('PEXPIRE', l, hist)
      if not keep(t, r) then
        redis.call('PUBLISH', wake .. r,
          cjson.encode({c = chat, t = t, k = num(token), pr = pr, pk = pks}))
      end
      return {t, num(token), pr, pks, r}
    end
  end
end
local function touch(q, w, ttl)
  redis.call('PEXPIRE', q, 3 * ttl)
  redis.call('PEXPIRE', w, 3 * ttl)
end
