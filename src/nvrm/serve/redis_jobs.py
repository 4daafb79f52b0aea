"""Jobs kept in Redis (``--job-store redis://HOST:PORT/DB``): every replica admits, queues, takes and answers them.

Keys live under ``{--job-namespace}:{model revision}:`` (P below), so replicas of two revisions never share work:

    P:index   ZSET  job id -> when it may be dropped (admitted: a grace; queued or running: never; finished: + --job-ttl-s)
    P:job:ID  HASH  kind, state (admitted, queued, running, done), group, content type, extra, result JSON, size, fetched
    P:body:ID STR   the request body, until the job is done (whichever replica takes it parses it again)
    P:queue   LIST  "group|id" entries waiting for a replica
    P:leases  ZSET  job id -> lease deadline; a lease not renewed (its replica died) puts the job back in the queue
    P:bytes   STR   bytes of the finished results kept (--max-job-results-mb holds across replicas)

Every step is one Lua script (atomic, on Redis' own clock), so the limits hold across replicas: a job counts
from its admission (before its body is read), and the first finished result wins; a later one is refused.
A result that cannot be kept (alone past the byte bound, or evicted unfetched to make room) leaves a marker
that answers 507 with the reason, never a 404 for a job that was accepted. Results are JSON, never pickled.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, Unavailable

JOB_ID = re.compile(r"[0-9a-f]{32}")
"""The ids this service issues (uuid4 hex); anything else is unknown before any key is built from it."""
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
local id = ARGV[2]
if redis.call('HGET', P..'job:'..id, 'state') ~= 'admitted' then return 0 end
redis.call('SET', P..'body:'..id, ARGV[6])
redis.call('HSET', P..'job:'..id, 'state', 'queued', 'kind', ARGV[3], 'group', ARGV[4], 'extra', ARGV[5], 'ctype', ARGV[7])
redis.call('ZADD', P..'index', PENDING + now(), id)
redis.call('RPUSH', P..'queue', ARGV[4]..'|'..id)
return 1
"""

_TAKE = _LIB + """
local t = now()
local lease, most, worker = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
for _, id in ipairs(redis.call('ZRANGEBYSCORE', P..'leases', '-inf', t)) do  -- their replica died: back to the front
  redis.call('ZREM', P..'leases', id)
  local job = P..'job:'..id
  if redis.call('HGET', job, 'state') == 'running' then
    redis.call('HSET', job, 'state', 'queued')
    redis.call('HINCRBY', job, 'retries', 1)
    redis.call('LPUSH', P..'queue', (redis.call('HGET', job, 'group') or '')..'|'..id)
  end
end
local first = redis.call('LPOP', P..'queue')
if not first then return {} end
local entries = {first}
local group = string.match(first, '^(.*)|')
if group ~= '' then  -- the rest of its group (one prompt's rollouts) comes along: they share one prefill
  for _, e in ipairs(redis.call('LRANGE', P..'queue', 0, 255)) do
    if #entries >= most then break end
    if string.match(e, '^(.*)|') == group then redis.call('LREM', P..'queue', 1, e); entries[#entries + 1] = e end
  end
end
local out = {}
for _, e in ipairs(entries) do
  local id = string.match(e, '|(.*)$')
  local job = P..'job:'..id
  if redis.call('HGET', job, 'state') == 'queued' then
    redis.call('HSET', job, 'state', 'running', 'worker', worker)
    redis.call('ZADD', P..'leases', t + lease, id)
    local f = redis.call('HMGET', job, 'kind', 'ctype', 'extra')
    out[#out + 1] = {id, f[1], f[2], f[3], redis.call('GET', P..'body:'..id)}
  end
end
return out
"""

_RENEW = _LIB + """
local t = now()
for i = 3, #ARGV do redis.call('ZADD', P..'leases', 'XX', t + tonumber(ARGV[2]), ARGV[i]) end
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
redis.call('EXPIRE', job, math.ceil(ttl * 2 + 60))
local over = tonumber(redis.call('GET', P..'bytes') or '0') - most
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
return {redis.call('ZCARD', P..'index'), redis.call('ZCOUNT', P..'index', PENDING, '+inf'), redis.call('LLEN', P..'queue')}
"""


@dataclass(frozen=True)
class Taken:
    """A job a replica took from the queue: its id, kind, body and what its submitter noted."""

    id: str
    kind: str
    content_type: str
    extra: dict[str, Any]
    body: bytes


def redacted(url: str) -> str:
    """``url`` without its password (for messages)."""
    return re.sub(r"//[^@/]*@", "//***@", url)


def connect(url: str, *, check: bool = True):
    """A redis-py client of ``url``; with ``check``, a ``ConfigError`` naming the URL when it cannot be reached."""
    try:
        import redis
    except ImportError as e:
        raise ConfigError(f"--job-store {redacted(url)}: redis-py is not installed; pip install 'nvrm[redis]'") from e
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=5, health_check_interval=10)
    except ValueError as e:
        raise ConfigError(f"--job-store {redacted(url)}: not a Redis URL ({e}); use redis://HOST:PORT/DB") from e
    if check:
        try:
            client.ping()
        except redis.RedisError as e:
            raise ConfigError(f"--job-store {redacted(url)}: Redis is unreachable ({e}); start it or fix the URL") from e
    return client


class RedisJobStore:
    """The shared store: admission, the work queue, leases and results, each step one atomic script."""

    def __init__(self, url: str, namespace: str, *, max_jobs: int, ttl_s: float, max_result_bytes: int, lease_s: float,
                 admit_grace_s: float):
        import redis

        self.url, self.namespace = redacted(url), namespace
        self.max_jobs, self.ttl_s, self.max_result_bytes, self.lease_s = max_jobs, ttl_s, max_result_bytes, lease_s
        self.admit_grace_s = admit_grace_s
        self.redis = connect(url)
        self._errors = redis.RedisError
        self._scripts = {name: self.redis.register_script(src) for name, src in
                         (("admit", _ADMIT), ("release", _RELEASE), ("enqueue", _ENQUEUE), ("take", _TAKE),
                          ("renew", _RENEW), ("finish", _FINISH), ("get", _GET), ("stats", _STATS),
                          ("fetched", _FETCHED))}
        self.prefix = f"{namespace}:unbound:"

    def bind(self, revision: str) -> None:
        """Use the keys of model revision ``revision`` from now on."""
        self.prefix = f"{self.namespace}:{revision}:"

    def _run(self, name: str, *args: Any) -> Any:
        try:
            return self._scripts[name](args=[self.prefix, *args])
        except self._errors as e:
            raise self.unavailable(e) from e

    def unavailable(self, e: Exception) -> Unavailable:
        """The 503 a Redis failure is answered with: full (maxmemory) or unreachable, with the reason."""
        text = " ".join(str(e).split())
        if type(e).__name__ == "OutOfMemoryError" or text.startswith("OOM") or "maxmemory" in text:
            why = f"Redis at {self.url} is full ({text[:160]}); raise its maxmemory or fetch results"
            return Unavailable("job store", why, 503, "job_store_full")
        return Unavailable("job store", f"Redis at {self.url} is unavailable ({type(e).__name__}: {text[:160]}); retry shortly",
                           503, "job_store_unavailable")

    def admit(self, job_id: str) -> str | None:
        """Count ``job_id`` as held from now (before its body is read); the reason when the store is full."""
        ok, held, pending = self._run("admit", job_id, self.max_jobs, self.admit_grace_s)
        if ok:
            return None
        return (f"the job store is full ({held} jobs, {pending} still running, across replicas; --max-jobs {self.max_jobs}); "
                "fetch results or retry shortly")

    def release(self, job_id: str) -> None:
        """Give back an admission whose body was refused."""
        self._run("release", job_id)

    def enqueue(self, job_id: str, kind: str, group: str, extra: dict[str, Any], body: bytes, content_type: str) -> bool:
        """Queue an admitted job for any replica; False when its admission was lost (expired, or Redis restarted)."""
        return bool(self._run("enqueue", job_id, kind, group, json.dumps(extra), body, content_type))

    def take(self, worker: str, most: int) -> list[Taken]:
        """Up to ``most`` queued jobs (the first and the rest of its group), leased to ``worker``."""
        out = []
        for jid, kind, ctype, extra, body in self._run("take", self.lease_s, most, worker):
            out.append(Taken(jid.decode(), kind.decode(), (ctype or b"").decode(), json.loads(extra or b"{}"), body or b""))
        return out

    def renew(self, job_ids: list[str]) -> None:
        """Extend the leases of the jobs this replica is scoring."""
        if job_ids:
            self._run("renew", self.lease_s, *job_ids)

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
        job = {k: v.decode() for k, v in fields.items() if k not in ("result", "extra")}
        job["extra"] = json.loads(fields.get("extra") or b"{}")
        job["result"] = json.loads(fields["result"]) if fields.get("result") else None
        return job

    def mark_fetched(self, job_id: str) -> None:
        """Note that the job's result reached a client (it may be evicted without a marker from now on)."""
        try:
            self._run("fetched", job_id)
        except Unavailable:
            pass  # only the eviction order depends on it

    def stats(self) -> tuple[int, int, int]:
        """Jobs held, still pending, and waiting in the queue (all replicas)."""
        held, pending, queued = self._run("stats")
        return int(held), int(pending), int(queued)
