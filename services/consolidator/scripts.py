"""The Lua scripts of the projection and of a forget time, each one atomic check-and-write: an
episode's events are recorded and its document written only while its event hash holds exactly the
events folded and no tombstone applies (`RECORD_LUA`, `PROJECT_LUA`, sharing `REPLACE_DOC_LUA`); `FORGET_USER_LUA` raises a user's, agent's or session's forget time.
"""

RECORD_LUA = """
if redis.call('EXISTS', KEYS[1]) == 1 then return {-1} end
redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2])
redis.call('SADD', KEYS[3], ARGV[3])
return {1, redis.call('HLEN', KEYS[2]), redis.call('HGET', KEYS[4], 'embed_hash')}
"""

REPLACE_DOC_LUA = """
local function replace_doc(key, blob)
  local doc = cmsgpack.unpack(blob)
  local old = redis.call('HMGET', key, 'status', 'last_accessed', 'access_count', 'vector')
  if old[1] then
    local has_vector = false
    for i = 1, #doc, 2 do if doc[i] == 'vector' then has_vector = true break end end
    if old[2] then doc[#doc + 1] = 'last_accessed' doc[#doc + 1] = old[2] end
    if old[3] then doc[#doc + 1] = 'access_count' doc[#doc + 1] = old[3] end
    if old[4] and not has_vector then doc[#doc + 1] = 'vector' doc[#doc + 1] = old[4] end
    redis.call('DEL', key)
  end
  redis.call('HSET', key, unpack(doc))
  return old[1]
end
"""
"""Writes a document whole, replacing, not merging (a field the new fold leaves out must not stay
indexed), carrying over what the query service owns (`last_accessed`, `access_count`) and a vector not
re-sent (its text did not change). Returns the old status (nil for a new document)."""

FORGOT_SINCE_LUA = """
local function forgot_since(keys, first, began)
  for i = first, first + 2 do
    local at = redis.call('GET', keys[i])
    if at and tonumber(at) >= tonumber(began) then return true end
  end
  return false
end
"""
"""True when one of the three scope tombstones at `keys[first..first+2]` (`Keys.scope_tombstones`: the
user's, the agent's, the session's forget time) is no earlier than `began`, the episode's first event."""

PROJECT_LUA = (
    REPLACE_DOC_LUA
    + FORGOT_SINCE_LUA
    + """
local out = {}
local a = 1
for e = 0, #KEYS / 7 - 1 do
  local k = e * 7
  local n, nsids = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  local status
  if redis.call('EXISTS', KEYS[k + 1]) == 1 then status = -1 else
    for i = a + 4, a + 3 + 2 * n, 2 do redis.call('HSETNX', KEYS[k + 2], ARGV[i], ARGV[i + 1]) end
    if nsids > 0 then redis.call('SADD', KEYS[k + 3], unpack(ARGV, a + 4 + 2 * n, a + 3 + 2 * n + nsids)) end
    if redis.call('HLEN', KEYS[k + 2]) ~= tonumber(ARGV[a + 2]) then status = 0 else
      if forgot_since(KEYS, k + 5, ARGV[a + 3]) then status = -2 else
        local was = replace_doc(KEYS[k + 4], ARGV[a + 4 + 2 * n + nsids])
        if was == 'completed' then status = 1 else status = 2 end
      end
    end
  end
  out[e + 1] = status
  a = a + 5 + 2 * n + nsids
end
return out
"""
)
"""Records and writes up to PROJECT_CHUNK episodes (the slow path records nothing, n = 0). Per episode,
KEYS: tombstone, event hash, stream-id set, document, the user's, agent's and session's tombstones;
ARGV: n events, n stream ids, the event count folded, first occurred_at, (event_id, payload) x n,
stream ids, the document as one msgpack blob. Returns per episode -1 (tombstoned: nothing recorded),
0 (recorded, the hash holds other events than those folded: fold the stored set),
-2 (recorded; its user, agent or session was forgotten after it began), 1 (document rewritten) or 2
(document new, or newly completed)."""

FORGET_USER_LUA = """
local cur = redis.call('GET', KEYS[1])
if (not cur) or tonumber(cur) < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], ARGV[1]) end
return 1
"""
