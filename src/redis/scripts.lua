-- Shared prelude of botmesh's per-chat Redis functions (the top of the library in
-- scripts.rs; it runs once when the library is loaded).
-- A chat has two keys, both with the hash tag {<chat>} so that a call touches one
-- slot:
--   s  state: HASH, every field short (so Redis keeps it as a compact listpack):
--        h         "k,u,n,c,t": the holder's (or, once free, the last holder's) token,
--                  until when its lease runs (server time, us; 0 once released), how
--                  many tickets the queue holds (field q and list q together, so the
--                  fast paths skip both), how many "!" marks the hash holds, and its
--                  ticket; one field, as every field read or written costs time
--        q         the queue's head: its oldest tickets, each between NULs
--                  ("\0t1\0t2\0"; empty or absent: none), at most Q_MAX bytes. Read
--                  with the holder record and written with it, so a message that
--                  queues behind one or two others costs no command on a second key
--        p         "pk,pr": the previous holder's token and replica, for this grant
--        e, qe     until when the key's own expiry, and list q's, is set (us)
--        a<r>      alive-until (us) of replica r's tickets in this chat, refreshed by
--                  its renewals (one field per replica: a deep queue costs a tick nothing)
--        m<id>     message id <id>: the claimant ticket while in flight, "!token,ticket"
--                  of the handling grant once handled (a retried release, or a retried
--                  enqueue, after a lost reply is recognised by it), "-" once its
--                  ticket gave up
--        f         "floor,hi" (see below)
--   q  the queue's tail: LIST of the tickets that did not fit in field q, in arrival
--      order; PX 3 x TTL, extended by waiters. A ticket joins the list whenever it
--      holds any, so the field's tickets are always the older ones.
-- A ticket is "<seq>:<replica>" (no replica id holds a NUL). Times are Redis TIME in
-- microseconds. The state is read with one HMGET and written with one HSET per call:
-- the fast paths make three redis.calls (TIME, HMGET, HSET; a release nobody waits
-- for, two), and their cost goes with the fields and arguments.
--
-- Dedup: the newest low..high handled marks of a chat are kept (low: the dedup_ids
-- option, high: 1.5 x low), the older ones evicted in batches (oldest token first).
-- For numeric ids (no leading zero, at most 15 digits) the chat keeps a floor, the
-- highest evicted id: an unknown numeric id at or under it is answered duplicate, as
-- ids rise per chat on Telegram. "hi" is the highest
-- numeric id claimed; an unknown id under it shows the chat's ids do not rise, and turns
-- the floor off for good (f = "x"), after which older ids are simply forgotten.
-- The library's globals and the functions it calls most, as its own locals: a global
-- is a look-up in the globals table on every use (and `string.find` a second one in
-- `string`), a local of the library an upvalue read, several times cheaper; a call
-- uses them dozens of times. While the library loads only the registration API
-- exists, so the first call binds them (`bind`, called by every function first).
local rcall, sfind, ssub, smatch, sformat, sbyte, floor, mmax, tonum, unpk
local function bind()
  rcall = redis.call
  sfind, ssub, smatch, sformat, sbyte = string.find, string.sub, string.match, string.format, string.byte
  floor, mmax, tonum, unpk = math.floor, math.max, tonumber, unpack
end
local function now_us()
  local t = rcall('TIME')
  -- Arithmetic on the reply's digit strings converts each once; tonumber() parses
  -- twice (lua_isnumber, then lua_tonumber), and strtod is a tenth of a call's time.
  return t[1] * 1000000 + t[2]
end
-- Integers as decimal strings; '%d' is exact up to 2^63 and several times cheaper than
-- '%.0f' (about 1 us per call here) or tostring (which rounds past 14 digits).
local function num(x) return sformat('%d', x) end
local function replica_of(t)
  local i = sfind(t, ':', 1, true)
  return ssub(t, i + 1)
end
local function numeric(id)
  if #id <= 15 and sfind(id, '^[1-9]%d*$') then return tonum(id) end
  return nil
end
-- The callers' settings (see `settings` in scripts.rs), parsed once per text: every
-- call of a coordinator sends the same one, and a number parsed from a string is a
-- strtod, about a tenth of a microsecond each. Emptied when it holds 64 (replicas
-- with many different settings only parse more often).
local SETTINGS, SETTINGS_N = {}, 0
local function settings(x)
  local cf = SETTINGS[x]
  if cf then return cf end
  local ttl, hist, keep, low, wake = smatch(x, '^(%d+),(%d+),(%d+),(%d+),(.*)$')
  if not wake then return error('ERR botmesh: bad settings argument ' .. x) end
  if SETTINGS_N >= 64 then SETTINGS, SETTINGS_N = {}, 0 end
  low = low + 0
  cf = {ttl = ttl + 0, hist = hist + 0, keep = keep + 0, wake = wake, low = low,
    high = low + mmax(1, floor(low / 2))}
  SETTINGS[x], SETTINGS_N = cf, SETTINGS_N + 1
  return cf
end
-- The call's view of the chat: the holder record parsed (C_t, C_k strings, '' when
-- none; C_u, C_n, C_c numbers), C_v the other fields read (false when absent, nil when
-- not read) and written since, C_w[1..C_wn] the writes not sent yet as HSET arguments
-- (a field written twice is sent twice, the later value winning), C_hd whether the
-- holder record changed, C_keep the call's keep ms (set before `load`: a function's
-- arguments are its own locals, which the prelude cannot see).
-- C_v and C_w live as long as the library and are emptied in place by each call:
-- a new table per call was grown slot by slot (a rehash per doubling, about 7 per
-- call), and was garbage the collector then swept. Each part of the view is a local
-- of the library, not a field of one table: an upvalue read is several times cheaper
-- than a table look-up, and a call makes about a hundred.
local C_v, C_w, C_wn = {}, {}, 0
local C_s, C_q, C_hd, C_now, C_keep
local C_t, C_k, C_u, C_n, C_c, C_n0, C_ns, C_c0, C_cs
-- Reads the holder record and the fields a..d (up to four; the expiry mark `e` among
-- them, unless the caller knows the hash exists: every hash that has `h` has `e`).
local function load(s, q, a, b, c, d, timeless)
  C_s, C_q, C_hd = s, q, false
  -- `timeless`: the caller asks for the time itself if it turns out to need it (a
  -- release of a chat nobody waits for needs none: TIME is one command of its three).
  if timeless then C_now = nil else C_now = now_us() end
  C_wn = 0
  local v = C_v
  for f in pairs(v) do v[f] = nil end
  local vals
  if d then
    vals = rcall('HMGET', s, 'h', a, b, c, d)
  elseif c then
    vals = rcall('HMGET', s, 'h', a, b, c)
  elseif b then
    vals = rcall('HMGET', s, 'h', a, b)
  else
    vals = rcall('HMGET', s, 'h', a)
  end
  v[a] = vals[2]
  if b then v[b] = vals[3] end
  if c then v[c] = vals[4] end
  if d then v[d] = vals[5] end
  C_t, C_k, C_u, C_n, C_c = '', '', 0, 0, 0
  C_n0, C_ns, C_c0, C_cs = 0, '0', 0, '0'
  local h = vals[1]
  if h then
    local k, u, n, c, t = smatch(h, '^([^,]*),([^,]*),([^,]*),([^,]*),(.*)$')
    if t then
      C_t, C_k, C_u, C_n, C_c = t, k, tonum(u) or 0, tonum(n) or 0, tonum(c) or 0
      -- The counts as read, so an unchanged count is written back as its own text
      -- (a number's `..` is a sprintf of %.14g, the costliest step of a flush).
      -- (Only a count that parsed: a damaged one is written afresh.)
      C_n0, C_ns, C_c0, C_cs = nil, n, nil, c
      if C_n ~= 0 or n == '0' then C_n0 = C_n end
      if C_c ~= 0 or c == '0' then C_c0 = C_c end
    end
  elseif v.e == nil then
    v.e = false
  end
end
local function put(f, x)
  if C_v[f] ~= x then
    local w, n = C_w, C_wn
    w[n + 1] = f
    w[n + 2] = x
    C_wn = n + 2
    C_v[f] = x
  end
end
local function set_n(n)
  if n < 0 then n = 0 end
  if n ~= C_n then C_n, C_hd = n, true end
end
local function flush()
  local args, n = C_w, C_wn
  if C_hd then
    n = n + 1
    args[n] = 'h'
    -- A released lease's end is 0: no format call for it. The counts n and c are
    -- small, so Lua's own number-to-string of `..` is exact for them.
    local u = C_u == 0 and '0' or num(C_u)
    local qn = C_n == C_n0 and C_ns or C_n
    local c = C_c == C_c0 and C_cs or C_c
    n = n + 1
    args[n] = C_k .. ',' .. u .. ',' .. qn .. ',' .. c .. ',' .. C_t
    C_hd = false
  end
  if n == 0 then return end
  C_wn = 0
  if C_v.e == false then
    if not C_now then C_now = now_us() end
    -- A hash this call did not find (or found without an expiry mark) gets one, so
    -- no path leaves state behind for good.
    local ms = floor(C_keep * 3 / 2)
    C_v.e = num(C_now + ms * 1000)
    args[n + 1] = 'e'
    args[n + 2] = C_v.e
    rcall('HSET', C_s, unpk(args, 1, n + 2))
    rcall('PEXPIRE', C_s, num(ms))
    return
  end
  rcall('HSET', C_s, unpk(args, 1, n))
end
-- Whether a live lease holds the chat.
local function held() return C_t ~= '' and C_u >= C_now end
-- A grant as a reply: "tag NUL t NUL k NUL pr NUL pk".
local function grant_reply(tag, t, k, pr, pk)
  return tag .. '\0' .. t .. '\0' .. k .. '\0' .. pr .. '\0' .. pk
end
-- The current holder as a reply "tag NUL t NUL k NUL pr NUL pk" (its previous holder
-- read now if this call has not read or written it). Replies are one string: Redis
-- converts a table's every element, and the table and its strings are garbage.
local function holder_reply(tag)
  if C_v.p == nil then C_v.p = rcall('HGET', C_s, 'p') end
  local pk, pr = smatch(C_v.p or ',', '^([^,]*),(.*)$')
  return grant_reply(tag, C_t, C_k, pr or '', pk or '')
end
-- Keeps list q at least 3 x ttl ms from now, never shortening it: a replica with a
-- short TTL must not cut the queue of a waiter with a long one. `qe` remembers until
-- when the list's expiry is known to run (us), so most calls need no PEXPIRE; `fresh`:
-- the RPUSH just created the list (it has no expiry yet).
local function keep_queue(ttl, fresh)
  if C_v.qe == nil then C_v.qe = rcall('HGET', C_s, 'qe') end
  local need = C_now + 3 * ttl * 1000
  local qe = tonum(C_v.qe)
  if not fresh and qe and qe >= need - ttl * 1000 then return end
  if fresh then
    rcall('PEXPIRE', C_q, num(3 * ttl))
  elseif rcall('PEXPIRE', C_q, num(3 * ttl), 'GT') == 0 and rcall('PTTL', C_q) == -1 then
    rcall('PEXPIRE', C_q, num(3 * ttl))
  end
  if fresh or not qe or qe < need then put('qe', num(need)) end
end
-- Keeps the state key at least `keep` ms past `upto` (us): the history, the dedup
-- window and any live lease all fit. Set to half as much again, so this is one PEXPIRE
-- per chat and hour or so, not one per message.
local function keep_until(upto, keep)
  if C_v.e == nil then C_v.e = rcall('HGET', C_s, 'e') end
  local e = tonum(C_v.e)
  if e and e >= upto + keep * 1000 then return end
  local ms = floor((upto - C_now) / 1000) + floor(keep * 3 / 2)
  -- The key must exist for PEXPIRE to stick: a new chat's first writes go first.
  put('e', num(C_now + ms * 1000))
  flush()
  -- As text: Redis formats a number argument with %.17g.
  rcall('PEXPIRE', C_s, num(ms))
end
-- The queue: its head in field q, its tail in list q (see the top). Q_MAX is Redis'
-- default hash-max-listpack-value: a longer field would turn the whole state hash
-- into a hash table for good, which costs a busy chat several KB.
local Q_MAX = 64
-- Field q as read (this call reads it if it has not).
local function queue()
  local q = C_v.q
  if q == nil then
    q = rcall('HGET', C_s, 'q')
    C_v.q = q
  end
  return q or ''
end
-- How many tickets field q holds.
local function field_count(q)
  local n, i = 0, sfind(q, '\0', 2, true)
  while i do
    n = n + 1
    i = sfind(q, '\0', i + 1, true)
  end
  return n
end
-- Whether the list holds any ticket (by the count: the list is not read).
local function spilled(q) return C_n > field_count(q) end
local function q_has(t)
  local q = queue()
  if sfind(q, '\0' .. t .. '\0', 1, true) then return true end
  return spilled(q) and rcall('LPOS', C_q, t) ~= false
end
-- Queues ticket t last; call before counting it in C_n.
local function q_push(t, ttl)
  local q = queue()
  if not spilled(q) then
    if q == '' then q = '\0' end
    local x = q .. t .. '\0'
    if #x <= Q_MAX then
      put('q', x)
      return
    end
  end
  local len = rcall('RPUSH', C_q, t)
  keep_queue(ttl, len == 1)
end
-- The first ticket, taken out; nil when the queue is empty. The list is popped only
-- while the count says it holds any: on a cluster node whose slot is migrating, a call
-- on a key that is gone (the last LPOP deleted the list) aborts the function midway
-- with its earlier writes kept.
local function q_pop()
  local q = queue()
  local i = sfind(q, '\0', 2, true)
  if i then
    local t = ssub(q, 2, i - 1)
    if i == #q then put('q', '') else put('q', ssub(q, i)) end
    return t
  end
  if q ~= '' then put('q', '') end
  return rcall('LPOP', C_q) or nil
end
-- Takes every copy of ticket t out; returns how many there were.
local function q_remove(t)
  local q = queue()
  local list = spilled(q)
  local pat = '\0' .. t .. '\0'
  local i = sfind(q, pat, 1, true)
  local n = 0
  while i do
    q = ssub(q, 1, i) .. ssub(q, i + #pat)
    n = n + 1
    i = sfind(q, pat, i, true)
  end
  if n > 0 then
    if q == '\0' then q = '' end
    put('q', q)
  end
  if list then n = n + rcall('LREM', C_q, 0, t) end
  return n
end
-- Both parts counted (only to repair a count lost with the state).
local function q_len()
  return field_count(queue()) + rcall('LLEN', C_q)
end
-- Keeps the queue (both parts) at least 3 x TTL from now: waiters are alive.
local function keep_tickets(ttl)
  keep_until(C_now + 3 * ttl * 1000, 0)
  if spilled(queue()) then keep_queue(ttl, false) end
end
-- Records a grant of the chat to ticket t (of replica r) with a lease of `lease` ms;
-- publishes it to r unless `kept` (the caller answers with it).
-- Returns t, k, pr, pk, r (values, not a table: no garbage).
-- The token is max(last + 1, server time in us). Tokens never run ahead of the clock
-- (a grant takes far more than a microsecond), so the time alone exceeds every earlier
-- token when the chat's state expired, was lost in a restart, or is stale because
-- Redis came back from an older snapshot or a lagging replica.
-- The previous holder is the last one (t, k stay after a release) while its grant is
-- at most `hist` ms old (a token is its grant's time, or just above).
local function grant(chat, t, r, lease, hist, keep_ms, wake, kept)
  local token = C_now
  local lk = tonum(C_k)
  if lk and lk + 1 > token then token = lk + 1 end
  local pr, pk = '', ''
  if C_t ~= '' and lk and C_now - lk <= hist * 1000 then
    pr, pk = replica_of(C_t), C_k
  end
  local k = num(token)
  local until_us = C_now + lease * 1000
  C_t, C_k, C_u, C_hd = t, k, until_us, true
  put('p', pk .. ',' .. pr)
  keep_until(until_us, keep_ms)
  if not kept then
    -- Ticket, token, previous replica and token, chat, NUL-separated: no replica id
    -- holds a NUL, tokens are digits and the chat, last, may hold anything. Several
    -- times cheaper than cjson.encode of a table (subscriber.rs parses both forms).
    rcall('PUBLISH', wake .. r, t .. '\0' .. k .. '\0' .. pr .. '\0' .. pk .. '\0' .. chat)
  end
  return t, k, pr, pk, r
end
-- Hands a free chat (the caller checked that no live lease holds it) to the first live
-- ticket in the queue, skipping lapsed ones. Returns the grant or nil. The caller
-- answers with (keeps) a grant to ticket `own_t` or to any ticket of replica `own_r`
-- (either may be nil); the others are published.
-- Pops at most C_n tickets: once the count says the queue is empty it is not read.
local function settle(chat, ttl, hist, keep_ms, wake, own_t, own_r)
  while C_n > 0 do
    local t = q_pop()
    if not t then
      set_n(0)
      return nil
    end
    set_n(C_n - 1)
    local r = replica_of(t)
    -- A releasing replica's own tickets need no liveness read: it is alive (it is
    -- calling, and the chat's state is whole: it just found its own grant there).
    -- A ticket found by its own re-check is read as others are: its state may have
    -- been lost (its liveness with it), and it is then re-queued, not granted.
    local kept = t == own_t or r == own_r
    local alive = nil
    if r ~= own_r then
      local af = 'a' .. r
      alive = tonum(C_v[af] or rcall('HGET', C_s, af))
    end
    if r == own_r or (alive and alive > C_now) then
      -- The grantee's own liveness bounds its lease, not the caller's TTL: replicas
      -- may run different TTLs (a rolling deploy), and alive-until was set from the
      -- grantee's TTL at its last renewal, so the lease never outlives a crashed
      -- grantee by more than its own TTL, nor lapses before it can renew. A grant the
      -- caller answers with (kept) is the caller's own, and the caller is alive: it
      -- gets a full TTL from now, which the caller counts from its call's send time.
      local lease = ttl
      if not kept then lease = floor((alive - C_now) / 1000) end
      if lease < 1 then lease = 1 end
      return grant(chat, t, r, lease, hist, keep_ms, wake, kept)
    end
  end
  return nil
end
-- Evicts the oldest handled marks once there are `high`, down to `low`, raising the
-- floor of a chat whose numeric ids rise. Called after flush(), with the hash up to
-- date. Marks are sorted as strings "token NUL field" (no Lua comparator: a sort of
-- ~100 marks with one was most of an eviction's time); tokens of one width sort as
-- numbers, and tokens of mixed widths are left-padded first.
local function evict(low, high)
  local all = rcall('HGETALL', C_s)
  local toks, fields, n, fv, width, mixed = {}, {}, 0, nil, nil, false
  for i = 1, #all, 2 do
    local f, x = all[i], all[i + 1]
    if f == 'f' then
      fv = x
    elseif sbyte(f, 1) == 109 and sbyte(x, 1) == 33 then
      local j = sfind(x, ',', 2, true) or (#x + 1)
      if width and width ~= j then mixed = true end
      width = j
      n = n + 1
      toks[n], fields[n] = ssub(x, 2, j - 1), f
    end
  end
  C_c, C_hd = n, true
  if n < high then
    flush()
    return
  end
  local keys = {}
  for i = 1, n do
    local tok = toks[i]
    if mixed then tok = sformat('%24s', tok) end
    keys[i] = tok .. '\0' .. fields[i]
  end
  table.sort(keys)
  local dels = {}
  local off = fv == 'x'
  local fl, hi = nil, ''
  if fv and not off then
    local a, b = smatch(fv, '^([^,]*),(.*)$')
    fl, hi = tonum(a), b or ''
  end
  for i = 1, n - low do
    local key = keys[i]
    local f = ssub(key, sfind(key, '\0', 1, true) + 1)
    dels[i] = f
    local x = numeric(ssub(f, 2))
    if x and not off and (not fl or x > fl) then fl = x end
  end
  rcall('HDEL', C_s, unpk(dels))
  C_c = n - #dels
  if fl and not off then put('f', num(fl) .. ',' .. hi) end
  flush()
end
