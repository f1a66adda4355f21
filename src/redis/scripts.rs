//! The Lua scripts of the turn protocol, loaded once and called by SHA.

use redis::{Connection, ErrorKind, RedisError, RedisResult, Script, ServerErrorKind};

pub(super) const PRELUDE: &str = include_str!("scripts.lua");

/// The arguments every per-chat script takes: KEYS h, q, w, l and optionally m (the
/// message claim); ARGV chat, ticket, TTL ms, history ms, wake channel prefix, then
/// the script's own.
pub(super) const CHAT_ARGS: &str = r#"
local h, q, w, l, m = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local chat, t = ARGV[1], ARGV[2]
local ttl, hist, wake = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
"#;

pub(super) const ENQUEUE: &str = r#"
local hv = holder(h)
if hv and hv[1] == t then return {'granted', t, hv[2], hv[3], hv[4]} end
local queued = redis.call('LLEN', q)
if queued > 0 and redis.call('LPOS', q, t) then return {'queued'} end
local now = nil
if m then
  local c = redis.call('GET', m)
  if c and string.byte(c, 1) == 33 then
    -- Handled by this very ticket: a retry of this enqueue whose first reply was lost.
    if c == '!' .. t then return {'queued'} end
    return {'duplicate'}
  end
  if c and c ~= t then
    -- Claimed by a live delivery not handled yet: ask again later (it may die).
    if hv and hv[1] == c then return {'inflight'} end
    if queued > 0 and redis.call('LPOS', q, c) then
      local wc = tonumber(redis.call('HGET', w, replica_of(c)))
      now = now_us()
      if wc and wc > now then return {'inflight'} end
    end
  end
  if c then redis.call('SET', m, t, 'KEEPTTL') else redis.call('SET', m, t, 'PX', ARGV[6]) end
end
local mine = function(x) return x == t end
if not hv and queued == 0 then
  local g = grant(h, l, chat, t, now, ttl, hist, wake, mine)
  return {'granted', t, g[2], g[3], g[4]}
end
now = now or now_us()
redis.call('RPUSH', q, t)
redis.call('HSET', w, replica_of(t), num(now + ttl * 1000))
touch(q, w, ttl)
if not hv then
  local g = settle(h, q, w, l, chat, ttl, hist, wake, mine)
  if g and g[1] == t then return {'granted', t, g[2], g[3], g[4]} end
end
return {'queued'}
"#;

pub(super) const RELEASE: &str = r#"
local me = ARGV[7]
local hv = holder(h)
if not hv or hv[1] ~= t or hv[2] ~= ARGV[6] then
  -- Not ours any more. If the lease simply expired, move the chat on.
  if not hv then settle(h, q, w, l, chat, ttl, hist, wake, never) end
  -- A retry of this very release whose reply was lost: the claim says so.
  if m and redis.call('GET', m) == '!' .. t then return {'released'} end
  return {'lost'}
end
if m and redis.call('GET', m) == t then redis.call('SET', m, '!' .. t, 'KEEPTTL') end
-- The next grant overwrites the holder; deleted only when nobody is next (a key
-- deleted and then written again fails mid-script during a slot migration).
local g = settle(h, q, w, l, chat, ttl, hist, wake, function(x, r) return r == me end)
if not g then redis.call('DEL', h) end
if g and g[5] == me then return {'released', g[1], g[2], g[3], g[4]} end
return {'released'}
"#;

pub(super) const RENEW: &str = r#"
local v = redis.call('GET', KEYS[1])
local ours = ARGV[1] .. '\0' .. ARGV[2] .. '\0'
if v and string.sub(v, 1, #ours) == ours then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 1
end
return 0
"#;

pub(super) const CHECK: &str = r#"
local hv = holder_or_settle(h, q, w, l, chat, t, ttl, hist, wake)
-- Held by this ticket or another of the caller's: the caller asks about its earliest
-- ticket by sequence, and one queued again later stands behind later ones.
local granted = hv and replica_of(hv[1]) == replica_of(t)
if granted or redis.call('LPOS', q, t) then
  -- The caller is alive: its later tickets in this chat stay so too (the re-check
  -- asks about its earliest ticket only, and a grant may wait a while to be used).
  redis.call('HSET', w, replica_of(t), num(now_us() + ttl * 1000))
  touch(q, w, ttl)
  if granted then
    -- Renewed as the holder's own renewal would: the caller counts the lease from
    -- this call, with no further round trip before using it.
    redis.call('PEXPIRE', h, ttl, 'GT')
    return {'granted', hv[1], hv[2], hv[3], hv[4]}
  end
  return {'waiting'}
end
-- Skipped after its replica's liveness lapsed (its field is still here), or lost with
-- the data (no trace of the replica in this chat).
if redis.call('HEXISTS', w, replica_of(t)) == 1 then return {'lapsed'} end
return {'gone'}
"#;

pub(super) const CANCEL: &str = r#"
local hv = holder_or_settle(h, q, w, l, chat, t, ttl, hist, wake)
if hv and hv[1] == t then return {'granted', t, hv[2], hv[3], hv[4]} end
redis.call('LREM', q, 0, t)
if m and redis.call('GET', m) == t then redis.call('DEL', m) end
return {'cancelled'}
"#;

/// Writes or deletes a chat's checkpoint (KEYS h, c; ARGV token, ttl ms, data):
/// refused (0) unless the chat's live holder (`h`, whose PX is the lease) has this
/// token, or when the stored checkpoint's token is newer. Stored as `token NUL data`.
pub(super) const WRITE_CHECKPOINT: &str = r#"
local token = tonumber(ARGV[1])
local hv = redis.call('GET', KEYS[1])
if not hv then return 0 end
local k = tonumber(string.match(hv, '^[^%z]*%z([^%z]*)'))
if k ~= token then return 0 end
local cur = redis.call('GET', KEYS[2])
if cur then
  local k = tonumber(string.match(cur, '^[^%z]*'))
  if k and token < k then return 0 end
end
if ARGV[3] then
  redis.call('SET', KEYS[2], ARGV[1] .. '\0' .. ARGV[3], 'PX', ARGV[2])
else
  redis.call('DEL', KEYS[2])
end
return 1
"#;

pub(super) struct Scripts {
    pub(super) enqueue: Script,
    pub(super) release: Script,
    pub(super) renew: Script,
    pub(super) check: Script,
    pub(super) cancel: Script,
    pub(super) write_checkpoint: Script,
}

impl Scripts {
    pub(super) fn new() -> Self {
        let with_prelude = |body: &str| Script::new(&format!("{PRELUDE}\n{CHAT_ARGS}\n{body}"));
        Scripts {
            enqueue: with_prelude(ENQUEUE),
            release: with_prelude(RELEASE),
            renew: Script::new(RENEW),
            check: with_prelude(CHECK),
            cancel: with_prelude(CANCEL),
            write_checkpoint: Script::new(WRITE_CHECKPOINT),
        }
    }

    /// Loads every script on one server (`SCRIPT LOAD` each): called on every
    /// primary at connect and on a node that answered `NOSCRIPT`.
    pub(super) fn load(&self, con: &mut Connection) -> RedisResult<()> {
        for s in self.all() {
            s.load(con)?;
        }
        Ok(())
    }

    /// Whether `e` says the server does not have the scripts (restarted without
    /// them, flushed, or a replica promoted: scripts are not replicated).
    pub(super) fn is_missing(e: &RedisError) -> bool {
        e.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
    }

    fn all(&self) -> [&Script; 6] {
        [
            &self.enqueue,
            &self.release,
            &self.renew,
            &self.check,
            &self.cancel,
            &self.write_checkpoint,
        ]
    }
}
