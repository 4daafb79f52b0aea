"""Jobs kept in Redis (``--job-store redis://HOST:PORT/DB``): every replica admits, queues, takes and answers them.

Keys live under ``{--job-namespace}:jobs:`` (P below). A job is fetched from any replica whatever revision serves
it; it is *scored* only by the weights it was accepted for (the digests the answers name: ``models.revision_of``),
or by the revision a model swap put in their place (the answer then says so):

    P:index     ZSET  job id -> when it may be dropped (admitted: a grace; queued or running: never; finished: + --job-ttl-s)
    P:job:ID    HASH  kind, state (admitted, queued, running, done), group, content type, extra, the revisions it asks
                      for (want) and its queue, times taken, result JSON, size, fetched; failed or evicted: the reason
    P:body:ID   STR   the request body, until the job is done (whichever replica takes it parses it again)
    P:queues    HASH  queue id -> the revisions its jobs ask for ({model name: revision}, JSON)
    P:q:QID     LIST  "group|id" entries waiting for a replica that serves those revisions
    P:swaps     HASH  "name<TAB>old revision" -> the revision a swap put in its place (any replica's, any route)
    P:replicas  HASH  replica -> the revisions it serves; P:alive ZSET replica -> until when it counts as alive
    P:leases    ZSET  job id -> lease deadline; a lease not renewed (its replica died) puts the job back in its queue,
                      at most --job-attempts times in all: then it fails with the reason (a poison job)
    P:bytes     STR   bytes of the finished results kept (--max-job-results-mb holds across replicas)

Every step is one Lua script (atomic, on Redis' own clock), so the limits hold across replicas: a job counts
from its admission (before its body is read), and the first finished result wins; a later one is refused.
No key carries a TTL: Redis never drops one by itself, so ``P:bytes`` is always the bytes held (and a volatile-*
eviction policy never touches them; an allkeys-* one is refused). A result that cannot be kept (alone past the
byte bound, or evicted unfetched to make room) leaves a marker that answers 507 with the reason, never a 404 for
a job that was accepted. A queue no live replica can serve (its revisions gone, no swap leading on) fails its
jobs with the reason after --job-ttl-s. Results are JSON, never pickled.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from ...errors import ConfigError, Unavailable
from ...protocol import JOB_ID, ErrorCode
from ..config import redacted, scrub, secrets_of

RETRY_AFTER_S = 2

_LIB = """
local P = ARGV[1]
local PENDING = 1e15
local function now() local t = redis.call('TIME'); return tonumber(t[1]) + tonumber(t[2]) / 1e6 end
local function drop(id)
  local size = tonumber(redis.call('HGET', P..'job:'..id, 'size') or '0') or 0
  if size > 0 then redis.call('DECRBY', P..'bytes', size) end
  redis.call('DEL', P..'job:'..id, P..'body:'..id)
  redis.call('ZREM', P..'index', id)
  redis.call('ZREM', P..'leases', id)
end
local function expire(t)
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', P..'index', '-inf', t)) do drop(id) end
end
local function beat(t, me, served, lease)  -- this replica is alive and serves these revisions
  for _, gone in ipairs(redis.call('ZRANGEBYSCORE', P..'alive', '-inf', t)) do redis.call('HDEL', P..'replicas', gone) end
  redis.call('ZREMRANGEBYSCORE', P..'alive', '-inf', t)
  redis.call('ZADD', P..'alive', t + 3 * lease, me)
  redis.call('HSET', P..'replicas', me, served)
end
"""

_ADMIT = _LIB + """
local t = now()
expire(t)
local held = redis.call('ZCARD', P..'index')
if held >= tonumber(ARGV[3]) then return {0, held, redis.call('ZCOUNT', P..'index', PENDING, '+inf')} end
redis.call('ZADD', P..'index', t + tonumber(ARGV[4]), ARGV[2])
redis.call('HSET', P..'job:'..ARGV[2], 'state', 'admitted', 'created', t)
return {1, held + 1, 0}
"""

_RELEASE = _LIB + """
if redis.call('HGET', P..'job:'..ARGV[2], 'state') == 'admitted' then drop(ARGV[2]) end
return 1
"""

_ENQUEUE = _LIB + """
local id, qid = ARGV[2], ARGV[8]
if redis.call('HGET', P..'job:'..id, 'state') ~= 'admitted' then return 0 end
redis.call('SET', P..'body:'..id, ARGV[6])
redis.call('HSET', P..'job:'..id, 'state', 'queued', 'kind', ARGV[3], 'group', ARGV[4], 'extra', ARGV[5], 'ctype', ARGV[7],
           'q', qid, 'want', ARGV[9])
redis.call('ZADD', P..'index', PENDING + now(), id)
redis.call('HSET', P..'queues', qid, ARGV[9])
redis.call('RPUSH', P..'q:'..qid, ARGV[4]..'|'..id)
return 1
"""

_TAKE = _LIB + """
local t = now()
local lease, most, worker, me, mine = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5], ARGV[6]
local attempts, ttl, orphan_s = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[11])
local served = cjson.decode(mine)
for _, l in ipairs(cjson.decode(ARGV[7])) do redis.call('HSET', P..'swaps', l[1]..'\\t'..l[2], l[3]) end
beat(t, me, ARGV[16], lease)
local function fail(id, why, code)  -- done, with a reason instead of a result (answered as a failed job)
  redis.call('DEL', P..'body:'..id)
  redis.call('ZREM', P..'leases', id)
  redis.call('HSET', P..'job:'..id, 'state', 'done', 'finished', t, 'size', 0, 'failed', why, 'code', code)
  redis.call('ZADD', P..'index', t + ttl, id)
end
local function leads(name, from, to)  -- a model swap (or a chain of them) put revision 'to' of 'name' in the place of 'from'
  local r = from
  for _ = 1, 32 do
    r = redis.call('HGET', P..'swaps', name..'\\t'..r)
    if not r then return false end
    if r == to then return true end
  end
  return false
end
local function fits(want, have)  -- 2: the revisions it asks for; 1: what swaps put in their place; 0: neither
  local fit = 2
  for name, rev in pairs(want) do
    local h = have[name]
    if h ~= rev then
      if h == nil or not leads(name, rev, h) then return 0 end
      fit = 1
    end
  end
  return fit
end
local others = nil
local function anyone(want)  -- does a live replica serve it?
  if others == nil then
    others = {}
    local r = redis.call('HGETALL', P..'replicas')
    for i = 2, #r, 2 do others[#others + 1] = cjson.decode(r[i]) end
  end
  for _, have in ipairs(others) do if fits(want, have) > 0 then return true end end
  return false
end
for _, id in ipairs(redis.call('ZRANGEBYSCORE', P..'leases', '-inf', t)) do  -- their replica died: back to the front
  redis.call('ZREM', P..'leases', id)
  local job = P..'job:'..id
  local f = redis.call('HMGET', job, 'state', 'taken', 'worker', 'q', 'want', 'group')
  if f[1] == 'running' then
    if (tonumber(f[2]) or 0) >= attempts then
      fail(id, ARGV[10]..(f[3] or '?'), ARGV[14])
    else
      redis.call('HSET', job, 'state', 'queued')
      redis.call('HSET', P..'queues', f[4], f[5])
      redis.call('LPUSH', P..'q:'..f[4], (f[6] or '')..'|'..id)
    end
  end
end
local best, best_at, spare, spare_at = nil, nil, nil, nil
local qs = redis.call('HGETALL', P..'queues')
for i = 1, #qs, 2 do
  local qid, q = qs[i], P..'q:'..qs[i]
  local head = redis.call('LINDEX', q, 0)
  if not head then redis.call('HDEL', P..'queues', qid) else
    local want = cjson.decode(qs[i + 1])
    local fit = fits(want, served)
    local at = tonumber(redis.call('HGET', P..'job:'..string.match(head, '|(.*)$'), 'created')) or t
    if fit == 2 or (fit == 1 and t - at >= lease) then  -- its own revisions first; a swapped-from one's once it waited
      if best == nil or at < best_at then best, best_at = q, at end
    elseif fit == 1 then
      if spare == nil or at < spare_at then spare, spare_at = q, at end
    elseif t - at >= orphan_s and not anyone(want) then  -- nobody serves what it asks for: each job fails, saying so
      local names = {}
      for name, rev in pairs(want) do names[#names + 1] = (name ~= '' and ("model '"..name.."' at ") or '')..'revision '..rev end
      for _, e in ipairs(redis.call('LRANGE', q, 0, -1)) do
        local id = string.match(e, '|(.*)$')
        if redis.call('HGET', P..'job:'..id, 'state') == 'queued' then fail(id, ARGV[12]..table.concat(names, ', ')..ARGV[13], ARGV[15]) end
      end
      redis.call('DEL', q)
      redis.call('HDEL', P..'queues', qid)
    end
  end
end
local q = best or spare
if q == nil then return {} end
local first = redis.call('LPOP', q)
local entries = {first}
local group = string.match(first, '^(.*)|')
if group ~= '' then  -- the rest of its group (one prompt's rollouts) comes along: they share one prefill
  for _, e in ipairs(redis.call('LRANGE', q, 0, 255)) do
    if #entries >= most then break end
    if string.match(e, '^(.*)|') == group then redis.call('LREM', q, 1, e); entries[#entries + 1] = e end
  end
end
local out = {}
for _, e in ipairs(entries) do
  local id = string.match(e, '|(.*)$')
  local job = P..'job:'..id
  if redis.call('HGET', job, 'state') == 'queued' then
    redis.call('HSET', job, 'state', 'running', 'worker', worker)
    redis.call('HINCRBY', job, 'taken', 1)
    redis.call('ZADD', P..'leases', t + lease, id)
    local f = redis.call('HMGET', job, 'kind', 'ctype', 'extra', 'want')
    out[#out + 1] = {id, f[1], f[2], f[3], redis.call('GET', P..'body:'..id), f[4]}
  end
end
return out
"""

_RENEW = _LIB + """
local t = now()
beat(t, ARGV[3], ARGV[4], tonumber(ARGV[2]))
for i = 5, #ARGV do redis.call('ZADD', P..'leases', 'XX', t + tonumber(ARGV[2]), ARGV[i]) end
return 1
"""

_FINISH = _LIB + """
local id, result, size, ttl, most = ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local job = P..'job:'..id
local state = redis.call('HGET', job, 'state')
if not state then return -1 end
if state == 'done' then return 0 end
local t = now()
redis.call('ZREM', P..'leases', id)
redis.call('DEL', P..'body:'..id)
if size > most then
  redis.call('HSET', job, 'state', 'done', 'finished', t, 'size', 0, 'evicted', ARGV[7])
else
  redis.call('HSET', job, 'state', 'done', 'finished', t, 'size', size, 'result', result)
  redis.call('INCRBY', P..'bytes', size)
end
redis.call('ZADD', P..'index', t + ttl, id)
local total = tonumber(redis.call('GET', P..'bytes') or '0')
if total > most then  -- before anything is evicted for it, the total is counted again from what is held
  total = 0
  for _, old in ipairs(redis.call('ZRANGEBYSCORE', P..'index', '-inf', PENDING - 1)) do
    total = total + (tonumber(redis.call('HGET', P..'job:'..old, 'size')) or 0)
  end
  redis.call('SET', P..'bytes', total)
end
local over = total - most
if over > 0 then  -- the oldest finished go first; one never fetched leaves a marker that answers 507
  for _, old in ipairs(redis.call('ZRANGEBYSCORE', P..'index', '-inf', PENDING - 1)) do
    if over <= 0 then break end
    local k = P..'job:'..old
    local s = tonumber(redis.call('HGET', k, 'size') or '0') or 0
    if s > 0 and old ~= id then
      over = over - s
      if redis.call('HGET', k, 'fetched') == '1' then drop(old) else
        redis.call('DECRBY', P..'bytes', s)
        redis.call('HSET', k, 'size', 0, 'evicted', ARGV[8])
        redis.call('HDEL', k, 'result')
      end
    end
  end
end
return 1
"""

_FETCHED = _LIB + """
if redis.call('HGET', P..'job:'..ARGV[2], 'state') == 'done' then redis.call('HSET', P..'job:'..ARGV[2], 'fetched', 1) end
return 1
"""

_GET = _LIB + """
expire(now())
return redis.call('HGETALL', P..'job:'..ARGV[2])
"""

_STATS = _LIB + """
expire(now())
local queued = 0
for _, qid in ipairs(redis.call('HKEYS', P..'queues')) do queued = queued + redis.call('LLEN', P..'q:'..qid) end
return {redis.call('ZCARD', P..'index'), redis.call('ZCOUNT', P..'index', PENDING, '+inf'), queued}
"""


@dataclass(frozen=True)
class Taken:
    """A job a replica took from the queue: its id, kind, body, what its submitter noted, and the revisions it asked for."""

    id: str
    kind: str
    content_type: str
    extra: dict[str, Any]
    body: bytes
    want: dict[str, str] = field(default_factory=dict)


def evicting(client) -> str | None:
    """Why Redis (a redis-py client) may drop accepted jobs by itself, or None: an ``allkeys-*`` maxmemory policy
    evicts any key once Redis is full (``volatile-*`` ones only keys with a TTL, and nvrm's keys carry none)."""
    policy = client.info("memory").get("maxmemory_policy")
    if isinstance(policy, bytes):
        policy = policy.decode()
    if isinstance(policy, str) and policy.startswith("allkeys-"):
        return (f"its maxmemory-policy is {policy}, which evicts any key once Redis is full, so accepted jobs could vanish "
                "without an error; set maxmemory-policy noeviction (Redis then refuses writes: 503 job_store_full)")
    return None


def connect(url: str, *, check: bool = True):
    """A redis-py client of ``url``; with ``check``, a ``ConfigError`` naming the URL (never its secrets) when it cannot
    be reached, or when its eviction policy could drop accepted jobs (``evicting``)."""
    shown, secrets = redacted(url), secrets_of(url)
    try:
        import redis
    except ImportError as e:
        raise ConfigError(f"--job-store {shown}: redis-py is not installed; pip install 'nvrm[redis]'") from e
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=5, health_check_interval=10)
    except ValueError as e:
        raise ConfigError(f"--job-store {shown}: not a Redis URL ({scrub(e, secrets)}); use redis://HOST:PORT/DB") from e
    if check:
        try:
            client.ping()
        except redis.RedisError as e:
            raise ConfigError(f"--job-store {shown}: Redis is unreachable ({scrub(e, secrets)}); start it or fix the URL") from e
        try:
            why = evicting(client)
        except redis.RedisError as e:
            raise ConfigError(f"--job-store {shown}: its maxmemory-policy could not be read (INFO memory: {scrub(e, secrets)}); "
                              "allow INFO, so that a Redis that evicts jobs is refused") from e
        if why is not None:
            raise ConfigError(f"--job-store {shown}: {why}")
    return client


def queue_of(want: dict[str, str]) -> str:
    """The id of the queue of jobs asking for the revisions ``want`` ({model name: revision})."""
    return hashlib.sha256(json.dumps(sorted(want.items())).encode()).hexdigest()[:24]


class RedisJobStore:
    """The shared store: admission, the work queues, leases and results, each step one atomic script."""

    POLICY_CHECK_S = 1.0
    """How long a reading of Redis' eviction policy is trusted before an admission reads it again."""

    def __init__(self, url: str, namespace: str, *, max_jobs: int, ttl_s: float, max_result_bytes: int, lease_s: float,
                 admit_grace_s: float, attempts: int = 3, orphan_s: float | None = None):
        import redis

        self.url, self.namespace, self._secrets = redacted(url), namespace, secrets_of(url)
        self.max_jobs, self.ttl_s, self.max_result_bytes, self.lease_s = max_jobs, ttl_s, max_result_bytes, lease_s
        self.admit_grace_s, self.attempts = admit_grace_s, attempts
        self.orphan_s = ttl_s if orphan_s is None else orphan_s
        self.redis = connect(url)
        self._errors = redis.RedisError
        self._scripts = {name: self.redis.register_script(src) for name, src in
                         (("admit", _ADMIT), ("release", _RELEASE), ("enqueue", _ENQUEUE), ("take", _TAKE),
                          ("renew", _RENEW), ("finish", _FINISH), ("get", _GET), ("stats", _STATS),
                          ("fetched", _FETCHED))}
        self.prefix = f"{namespace}:jobs:"
        self.served: dict[str, str] = {}
        """The revisions this replica serves ({model name: revision}) when ``enqueue`` and ``take`` are given none."""
        self.me = uuid.uuid4().hex[:16]
        """This store's replica in ``P:replicas`` (unique even when two replicas share a --replica-id)."""
        self._policy_read, self._policy_why = time.monotonic(), None  # connect() has just read it

    def bind(self, revision: str) -> None:
        """Serve one unnamed model at ``revision``: what ``enqueue`` asks for and ``take`` serves when given no revisions."""
        self.served = {"": revision}

    def _run(self, name: str, *args: Any) -> Any:
        try:
            return self._scripts[name](args=[self.prefix, *args])
        except self._errors as e:
            raise self.unavailable(e) from e

    def unavailable(self, e: Exception) -> Unavailable:
        """The 503 a Redis failure is answered with: full (maxmemory) or unreachable, with the reason (no secret)."""
        text = scrub(e, self._secrets)
        if type(e).__name__ == "OutOfMemoryError" or text.startswith("OOM") or "maxmemory" in text:
            why = f"Redis at {self.url} is full ({text[:160]}); raise its maxmemory or fetch results"
            return Unavailable("job store", why, 503, ErrorCode.JOB_STORE_FULL)
        return Unavailable("job store", f"Redis at {self.url} is unavailable ({type(e).__name__}: {text[:160]}); retry shortly",
                           503, ErrorCode.JOB_STORE_UNAVAILABLE)

    def _evicting(self) -> str | None:
        """``evicting`` of this Redis, read again once ``POLICY_CHECK_S`` has passed (its policy may change at run time)."""
        if time.monotonic() - self._policy_read >= self.POLICY_CHECK_S:
            try:
                self._policy_why = evicting(self.redis)
            except self._errors as e:
                raise self.unavailable(e) from e
            self._policy_read = time.monotonic()
        return self._policy_why

    def admit(self, job_id: str) -> str | None:
        """Count ``job_id`` as held from now (before its body is read); the reason when the store is full. Raises
        ``Unavailable`` while Redis could evict accepted jobs by itself (``evicting``)."""
        if (why := self._evicting()) is not None:
            raise Unavailable("job store", f"Redis at {self.url}: {why}; no job is accepted until then", 503,
                              ErrorCode.JOB_STORE_UNAVAILABLE)
        ok, held, pending = self._run("admit", job_id, self.max_jobs, self.admit_grace_s)
        if ok:
            return None
        return (f"the job store is full ({held} jobs, {pending} still running, across replicas; --max-jobs {self.max_jobs}); "
                "fetch results or retry shortly")

    def release(self, job_id: str) -> None:
        """Give back an admission whose body was refused."""
        self._run("release", job_id)

    def enqueue(self, job_id: str, kind: str, group: str, extra: dict[str, Any], body: bytes, content_type: str,
                want: dict[str, str] | None = None) -> bool:
        """Queue an admitted job for the replicas serving ``want`` ({model name: revision}; default ``served``); False
        when its admission was lost (expired, or Redis restarted)."""
        want = dict(self.served if want is None else want)
        return bool(self._run("enqueue", job_id, kind, group, json.dumps(extra), body, content_type, queue_of(want),
                              json.dumps(want, sort_keys=True)))

    def take(self, worker: str, most: int, *, served: dict[str, str] | None = None, holds: dict[str, str] | None = None,
             links: list[tuple[str, str, str]] | tuple = ()) -> list[Taken]:
        """Up to ``most`` queued jobs (the first and the rest of its group) that ``served`` ({model name: revision}; default
        ``served``) can score, leased to ``worker``. ``holds``: what this replica says it is alive with (default ``served``;
        more while ``--swap-mode replace`` loads a model). ``links`` are this replica's swaps ``(name, old revision, new)``
        not yet recorded: from now on, jobs asking for the old revision may be scored by the new one."""
        served = self.served if served is None else served
        dead = (f"the replica scoring it died (its lease of {self.lease_s:g} s ran out) each of the {self.attempts} times it "
                "was taken, so it is not handed out again (an input that kills the replica?); the last one was ")
        gone = ("no replica serves ", f" any more, and no model swap put a served revision in its place, after {self.orphan_s:g} s; "
                "submit the job again")
        rows = self._run("take", self.lease_s, most, worker, self.me, json.dumps(served, sort_keys=True), json.dumps([list(x) for x in links]),
                         self.attempts, self.ttl_s, dead, self.orphan_s, gone[0], gone[1], str(ErrorCode.INTERNAL),
                         str(ErrorCode.UNAVAILABLE), json.dumps(served if holds is None else holds, sort_keys=True))
        out = []
        for jid, kind, ctype, extra, body, want in rows:
            out.append(Taken(jid.decode(), kind.decode(), (ctype or b"").decode(), json.loads(extra or b"{}"), body or b"",
                             json.loads(want or b"{}")))
        return out

    def renew(self, job_ids: list[str], served: dict[str, str] | None = None) -> None:
        """Extend the leases of the jobs this replica is scoring, and say it is alive (serving ``served``)."""
        self._run("renew", self.lease_s, self.me, json.dumps(self.served if served is None else served, sort_keys=True), *job_ids)

    def finish(self, job_id: str, result: Any) -> int:
        """Keep ``result`` (JSON): 1 kept, 0 a duplicate (another replica finished it first), -1 the job is gone."""
        text = json.dumps(result)
        size = len(text.encode())
        mb = self.max_result_bytes / 2**20
        too_big = f"its result is {size} bytes, more than --max-job-results-mb {mb:g} allows; send fewer items per job or raise the limit"
        evicted = f"its result was dropped unfetched to stay under --max-job-results-mb {mb:g}; fetch results sooner or raise the limit"
        return int(self._run("finish", job_id, text, size, self.ttl_s, self.max_result_bytes, too_big, evicted))

    def get(self, job_id: str) -> dict[str, Any] | None:
        """The job's fields (``result`` parsed), or None when unknown, expired, or not an id this service issues."""
        if not JOB_ID.fullmatch(job_id):
            return None
        flat = self._run("get", job_id)
        if not flat:
            return None
        fields = {flat[i].decode(): flat[i + 1] for i in range(0, len(flat), 2)}
        job = {k: v.decode() for k, v in fields.items() if k not in ("result", "extra", "want")}
        job["extra"] = json.loads(fields.get("extra") or b"{}")
        job["want"] = json.loads(fields.get("want") or b"{}")
        job["result"] = json.loads(fields["result"]) if fields.get("result") else None
        return job

    def mark_fetched(self, job_id: str) -> None:
        """Note that the job's result reached a client (it may be evicted without a marker from now on)."""
        try:
            self._run("fetched", job_id)
        except Unavailable:
            pass  # only the eviction order depends on it

    def stats(self) -> tuple[int, int, int]:
        """Jobs held, still pending, and waiting in the queues (all replicas)."""
        held, pending, queued = self._run("stats")
        return int(held), int(pending), int(queued)
