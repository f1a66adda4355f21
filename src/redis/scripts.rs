//! The turn protocol in Lua: one Redis function library, loaded once and called with `FCALL`.

use redis::{Connection, ErrorKind, RedisError, RedisResult, Script, ServerErrorKind};

pub(super) const PRELUDE: &str = include_str!("scripts.lua");

/// The arguments every per-chat script takes: KEYS s (state), q (the queue's tail); ARGV chat,
/// ticket, the caller's settings ([`settings`]), message id (`""`: none, or dedup
/// off), then the script's own: `enqueue` the claim's lifetime (ms), `release` the
/// token and the caller's replica.
pub(super) const CHAT_ARGS: &str = r#"
local s, q = KEYS[1], KEYS[2]
local chat, t = ARGV[1], ARGV[2]
local cf = settings(ARGV[3])
local ttl, hist, wake, keep_ms = cf.ttl, cf.hist, cf.wake, cf.keep
C_keep = keep_ms
local id = ARGV[4]
if id == '' then id = nil end
local mf = id and ('m' .. id)
"#;

/// The settings argument of the per-chat functions: `"ttl,hist,keep,ids,wake"`, the
/// lease TTL, the history and the keep time (how long the state outlives the chat's
/// last grant: the larger of the history and the dedup window), all in ms, the
/// handled ids a chat keeps at least (`dedup_ids`), and the wake channel prefix
/// (last: it may hold commas). The same in every call of a coordinator, so the
/// library parses each text it meets once and keeps the numbers (see `settings` in
/// the prelude): one argument instead of five, and no number parsed per call.
pub(super) fn settings(ttl_ms: u64, hist_ms: u64, keep_ms: u64, ids: usize, wake: &str) -> String {
    format!("{ttl_ms},{hist_ms},{keep_ms},{ids},{wake}")
}

pub(super) const ENQUEUE: &str = r#"
local me = replica_of(t)
if id then load(s, q, 'e', 'q', mf, 'f') else load(s, q, 'e', 'q') end
local live = held()
if live and C_t == t then return holder_reply('granted') end
-- A retry of this very enqueue is already queued. With a message id, only a ticket
-- that holds the id's claim can be (every enqueue that queues claims it).
if C_n > 0 and (not id or C_v[mf] == t) and q_has(t) then
  return 'queued'
end
if id then
  local c = C_v[mf]
  if c and sbyte(c, 1) == 33 then
    -- Handled by this very ticket: a retry of this enqueue whose first reply was lost.
    -- The grant's own end reports the message; it was not a duplicate.
    if smatch(c, '^![^,]*,(.*)$') == t then return 'queued' end
    return 'duplicate'
  end
  local fresh = not c
  if c == '-' then c = nil end
  if c and c ~= t then
    -- Claimed by a live delivery not handled yet: ask again later (it may die).
    if live and C_t == c then return 'inflight' end
    if C_n > 0 and q_has(c) then
      local wc = tonum(rcall('HGET', s, 'a' .. replica_of(c)))
      if wc and wc > C_now then return 'inflight' end
    end
  end
  local x = numeric(id)
  local fv = C_v.f
  if fresh and x and fv ~= 'x' then
    local fl, hi, a = nil, nil, nil
    if fv then
      local b
      a, b = smatch(fv, '^([^,]*),(.*)$')
      fl, hi = tonum(a), tonum(b)
    end
    if fl and x <= fl then return 'duplicate' end
    if hi and x < hi then
      put('f', 'x')
    else
      -- The floor as read (evict wrote it as digits): no number formatted again.
      put('f', (fl and a or '') .. ',' .. id)
    end
  end
  put(mf, t)
end
if not live and C_n == 0 then
  local _, k, pr, pk = grant(chat, t, me, ttl, hist, keep_ms, wake, true)
  flush()
  return grant_reply('granted', t, k, pr, pk)
end
q_push(t, ttl)
set_n(C_n + 1)
put('a' .. me, num(C_now + ttl * 1000))
-- The queue's head lives in the state: the key outlives the ticket's liveness (3 x
-- TTL, as alive-until is refreshed every TTL / 3 at most), whatever its last grant was.
keep_until(C_now + 3 * ttl * 1000, 0)
-- The claim outlives the message's wait and one lease more (ARGV[5], ms): the state,
-- which holds it, already outlives any live lease by keep_ms, so only a longer claim
-- needs the key's expiry moved.
if id then
  local claim_ms = tonum(ARGV[5]) or 0
  if claim_ms > keep_ms then keep_until(C_now, claim_ms) end
end
local gt, gk, gpr, gpk = nil, nil, nil, nil
if not live then gt, gk, gpr, gpk = settle(chat, ttl, hist, keep_ms, wake, t, nil) end
flush()
if gt == t then return grant_reply('granted', t, gk, gpr, gpk) end
return 'queued'
"#;

pub(super) const RELEASE: &str = r#"
local token, me = ARGV[5], ARGV[6]
-- Handled ids a chat keeps at least (the dedup_ids option); evicted in batches.
local low, high = cf.low, cf.high
local handled_mark = '!' .. token .. ',' .. t
-- `e` for the grant a hand-over makes (one field read is cheaper than a call).
if id then load(s, q, 'e', 'q', mf, nil, true) else load(s, q, 'e', 'q', nil, nil, true) end
-- Ours while no other grant was made since ours and it was not released: a lease that
-- ran out with nobody granted the chat after it still was the only one (exclusion held),
-- so its release needs no clock. The holder learns of a lease that ran out on its own
-- side (its deadline) and of a refused renewal.
if not (C_t == t and C_k == token and C_u ~= 0) then
  C_now = now_us()
  -- Not ours any more. If a lease simply expired, move the chat on.
  if not held() and C_n > 0 then settle(chat, ttl, hist, keep_ms, wake, nil, nil) end
  flush()
  -- A retry of this very release whose reply was lost: the mark says so.
  if id and C_v[mf] == handled_mark then return 'released' end
  return 'lost'
end
C_u, C_hd = 0, true
local marked = false
if id and C_v[mf] == t then
  put(mf, handled_mark)
  C_c = C_c + 1
  marked = true
end
local gt, gk, gpr, gpk, gr = nil, nil, nil, nil, nil
if C_n > 0 then
  C_now = now_us()
  gt, gk, gpr, gpk, gr = settle(chat, ttl, hist, keep_ms, wake, nil, me)
end
flush()
if marked and C_c >= high then evict(low, high) end
if gt and gr == me then return grant_reply('released', gt, gk, gpr, gpk) end
return 'released'
"#;

/// Extends a held lease (KEYS s; ARGV ticket, token, TTL ms, keep ms): 1 when it was
/// still this grant's and live, 0 otherwise.
pub(super) const RENEW: &str = r#"
local s = KEYS[1]
local v = rcall('HMGET', s, 'h', 'e')
if not v[1] then return 0 end
local k, u, rest = smatch(v[1], '^([^,]*),([^,]*),(.*)$')
local t = rest and smatch(rest, '^[^,]*,[^,]*,(.*)$')
local now = now_us()
if t == ARGV[1] and k == ARGV[2] and (tonum(u) or 0) >= now then
  local nu = now + tonum(ARGV[3]) * 1000
  local h = k .. ',' .. sformat('%d', nu) .. ',' .. rest
  local keep = tonum(ARGV[4])
  if (tonum(v[2]) or 0) < nu + keep * 1000 then
    local ms = floor((nu - now) / 1000) + floor(keep * 3 / 2)
    rcall('PEXPIRE', s, num(ms))
    rcall('HSET', s, 'h', h, 'e', num(now + ms * 1000))
  else
    rcall('HSET', s, 'h', h)
  end
  return 1
end
return 0
"#;

pub(super) const CHECK: &str = r#"
local me = replica_of(t)
load(s, q, 'e', 'a' .. me, 'q', 'qe')
local seen = C_v['a' .. me]
-- The count of queued tickets bounds every hand-over; a check is where a count lost
-- to a restart or a stale replica is repaired (before any pop may empty the list).
if not held() and C_n == 0 then set_n(q_len()) end
if not held() then settle(chat, ttl, hist, keep_ms, wake, t, nil) end
-- Held by this ticket or another of the caller's: the caller asks about its earliest
-- ticket by sequence, and one queued again later stands behind later ones.
if held() and replica_of(C_t) == me then
  -- The caller is alive: its later tickets in this chat stay so too (the re-check
  -- asks about its earliest ticket only, and a grant may wait a while to be used).
  put('a' .. me, num(C_now + ttl * 1000))
  if C_n > 0 then keep_tickets(ttl) end
  -- Renewed as the holder's own renewal would, never shortened: the caller counts the
  -- lease from this call, with no further round trip before using it.
  local u = C_now + ttl * 1000
  if u > C_u then
    C_u, C_hd = u, true
    keep_until(u, keep_ms)
  end
  flush()
  return holder_reply('granted')
end
if q_has(t) then
  put('a' .. me, num(C_now + ttl * 1000))
  if C_n == 0 then set_n(q_len()) end
  keep_tickets(ttl)
  flush()
  return 'waiting'
end
flush()
-- Skipped after its replica's liveness lapsed (its field is still here), or lost with
-- the data (no trace of the replica in this chat).
if seen then return 'lapsed' end
return 'gone'
"#;

pub(super) const CANCEL: &str = r#"
if id then load(s, q, 'e', 'q', mf) else load(s, q, 'e', 'q') end
if not held() then settle(chat, ttl, hist, keep_ms, wake, t, nil) end
if held() and C_t == t then
  flush()
  return holder_reply('granted')
end
local removed = q_remove(t)
if removed > 0 then set_n(C_n - removed) end
-- Given up: a redelivery of the message may run (and no floor ever covers it).
if id and C_v[mf] == t then put(mf, '-') end
flush()
return 'cancelled'
"#;

/// Writes or deletes a chat's checkpoint (KEYS s, c; ARGV token, ttl ms, data):
/// refused (0) unless the chat's live holder (field `h` of `s`: token, lease end, …)
/// has this token, or when the stored checkpoint's token is newer. Stored as
/// `token NUL data`.
pub(super) const WRITE_CHECKPOINT: &str = r#"
local token = tonum(ARGV[1])
local hv = rcall('HGET', KEYS[1], 'h')
if not hv then return 0 end
local k, u = smatch(hv, '^([^,]*),([^,]*),')
local now = now_us()
if (tonum(u) or 0) < now then return 0 end
if tonum(k) ~= token then return 0 end
local cur = rcall('GET', KEYS[2])
if cur then
  local k = tonum(smatch(cur, '^[^%z]*'))
  if k and token < k then return 0 end
end
if ARGV[3] then
  rcall('SET', KEYS[2], ARGV[1] .. '\0' .. ARGV[3], 'PX', ARGV[2])
else
  rcall('DEL', KEYS[2])
end
return 1
"#;

/// The turn protocol as one Redis function library (Redis 7 `FUNCTION LOAD`, called
/// with `FCALL`): the prelude runs once when the library loads, not on every call as
/// with `EVALSHA` (about 3 µs a call here). The library and its functions are named
/// after a hash of the code, so replicas of different versions sharing a server never
/// replace each other's code.
pub(super) struct Scripts {
    /// The library's source, for `FUNCTION LOAD REPLACE`.
    pub(super) source: String,
    pub(super) enqueue: String,
    pub(super) release: String,
    pub(super) renew: String,
    pub(super) check: String,
    pub(super) cancel: String,
    pub(super) write_checkpoint: String,
}

impl Scripts {
    /// Loads the library on one server (`FUNCTION LOAD REPLACE`): called on every
    /// primary at connect and on a node that answered that it lacks it.
    pub(super) fn load(&self, con: &mut Connection) -> RedisResult<()> {
        redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg("REPLACE")
            .arg(&self.source)
            .exec(con)
    }

    /// Whether Redis lacks the function library (a restart without persistence,
    /// `FUNCTION FLUSH`, or a node that never had it): it is loaded again and the
    /// call retried.
    pub(super) fn is_missing(e: &RedisError) -> bool {
        e.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
            || e.to_string().contains("Function not found")
    }
}

impl Scripts {
    pub(super) fn new() -> Self {
        let bodies = [
            ("enqueue", true, ENQUEUE),
            ("release", true, RELEASE),
            ("renew", false, RENEW),
            ("check", true, CHECK),
            ("cancel", true, CANCEL),
            ("write_checkpoint", false, WRITE_CHECKPOINT),
        ];
        let mut code = format!("{PRELUDE}\n");
        for (name, chat, body) in bodies {
            let args = if chat { CHAT_ARGS } else { "" };
            code.push_str(&format!(
                "redis.register_function('@{name}', function(KEYS, ARGV)\nif not rcall then bind() end\n{args}\n{body}\nend)\n"
            ));
        }
        // The SHA-1 of the code names the library (`Script` computes it).
        let sha = Script::new(&code).get_hash().to_owned();
        let tag = format!("botmesh_{}", &sha[..12]);
        let code = code.replace("'@", &format!("'{tag}_"));
        let name = |f: &str| format!("{tag}_{f}");
        Scripts {
            source: format!("#!lua name={tag}\n{code}"),
            enqueue: name("enqueue"),
            release: name("release"),
            renew: name("renew"),
            check: name("check"),
            cancel: name("cancel"),
            write_checkpoint: name("write_checkpoint"),
        }
    }
}
