"""The one place that reads reckon's environment into a frozen settings object."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping
from urllib.parse import urlsplit

from pipeline.fleet import Server
from pipeline.fleet import parse as parse_servers
from pipeline.mediatypes import content_types

#: State and broker live in one redis-server, in two logical databases (docs/redis.md "Databases and shards").
DEFAULT_REDIS_URL = "redis://127.0.0.1:6390/0"
DEFAULT_BROKER_URL = "redis://127.0.0.1:6390/1"
#: The simulated provider speaks ComfyUI's HTTP API on ComfyUI's default port.
DEFAULT_PROVIDER_URL = "http://127.0.0.1:8188"
#: The fleet (``name=url;cap=N;price=P,...``, see pipeline/fleet.py); empty: one server at the URL.
DEFAULT_PROVIDERS = ""
#: Prompts in flight per server unless its entry says ``cap=N``.
DEFAULT_PROVIDER_CAP = 2
DEFAULT_BLOB_DIR = "var/blobs"
#: Where outputs are stored (docs/operations.md "Blob store"): empty for the local directory above, or
#: ``s3://BUCKET[/PREFIX]`` for an S3-compatible bucket that every host reaches...
DEFAULT_BLOB_URL = ""
#: How a local blob store makes a put durable: ``group`` (a ``syncfs`` of its filesystem shared by
#: every put waiting; the default) or ``file`` (an fsync of each file and of its directory: for a
#: blob directory on a filesystem other heavy writers share, whose dirty data every syncfs waits for).
DEFAULT_BLOB_SYNC = "group"
#: ...at this endpoint (``http://host:port`` of MinIO, Ceph RGW...); empty: AWS S3 itself.
DEFAULT_S3_ENDPOINT = ""
#: Cost units charged per output image by a server whose entry says no ``price=``; must match the
#: provider's real price. A job is reserved at the highest price of the fleet (``fleet.highest_price``).
DEFAULT_PRICE_PER_OUTPUT = 10
#: Attempts a job may make; the reservation covers all of them unless max_cost lowers it.
DEFAULT_MAX_ATTEMPTS = 3
#: How long a claim lives without a heartbeat (heartbeats come every third of it).
DEFAULT_LEASE_SECONDS = 30.0
#: Liveness (docs/design.md "Liveness"): the lease keeper stops renewing an attempt's claim this long past
#: its job's deadline (time to collect a prompt that ended near it; reconciliation does the rest)...
DEFAULT_DEADLINE_GRACE_SECONDS = 120.0
#: ...or once its thread has made no progress (status answered, output stored) for this long: more
#: than the slowest step, an output fetch (60 s) then its S3 put with retries (3 x 35 s) and a Redis write.
DEFAULT_STALL_SECONDS = 300.0
#: The longest one output's download from a server may take, however steadily its bytes come.
DEFAULT_OUTPUT_FETCH_SECONDS = 60.0
#: What may follow a download before the thread reports progress: its S3 put with retries (3 tries
#: of 5 s connect and 30 s read) and a Redis write (10 s). The stall time must exceed both together.
STEP_AFTER_FETCH_SECONDS = 115.0
#: How long an idempotency record is kept; after that the key may create a new job.
DEFAULT_IDEMPOTENCY_TTL_SECONDS = 24 * 3600
#: How long a web process trusts a key it looked up (s): a revoked key or a disabled tenant is refused within it.
DEFAULT_AUTH_CACHE_SECONDS = 1.0
#: The longest a web process may trust a key it looked up (s).
MAX_AUTH_CACHE_SECONDS = 10.0
#: Content types reckon cannot clean of metadata that are stored as they came (comma-separated; empty:
#: refuse them all; docs/operations.md "Outputs reckon cannot clean"). Each may carry the workflow.
DEFAULT_OUTPUT_UNCLEANED_TYPES: frozenset[str] = frozenset()
#: Largest request body accepted (413 above it) and largest workflow inside it (422).
DEFAULT_MAX_BODY_BYTES = 512 * 1024
DEFAULT_MAX_WORKFLOW_BYTES = 256 * 1024
DEFAULT_DEADLINE_SECONDS = 3600
#: Seconds an attempt may execute when its job names no ``max_seconds``, per class; 0: no default, so a job
#: that may run on a server priced per second must name it (422 max-seconds-required: docs/costs.md).
DEFAULT_MAX_SECONDS_INTERACTIVE = DEFAULT_MAX_SECONDS_BATCH = 0
#: Uploaded inputs (docs/api.md "Inputs"): the largest one (413 above it), the bytes a tenant may keep
#: (507 above them; ``reckon tenant set --input-quota`` overrides it), how many inputs it may keep (507
#: above: each costs Redis about 800 bytes and the blob store a file, whatever its size), and how long one
#: no job names is kept.
DEFAULT_INPUT_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_INPUT_QUOTA_BYTES = 1024 * 1024 * 1024
DEFAULT_INPUT_MAX_COUNT = 10_000
DEFAULT_INPUT_RETENTION_SECONDS = 30 * 24 * 3600
#: An admitted job not known to be in the broker after this long is published again; so is
#: any queued (or reconciling) job not claimed within it, the window doubling per redelivery.
DEFAULT_OUTBOX_GRACE_SECONDS = 10.0
DEFAULT_SWEEP_INTERVAL_SECONDS = 1.0
#: A sweeper holds the tenants it takes for this long (one pass): a second sweeper takes others, and
#: the tenants of a sweeper that died mid-pass come due again, for any sweeper, when the hold ends.
DEFAULT_SWEEP_HOLD_SECONDS = 30.0
DEFAULT_POLL_INTERVAL_SECONDS = 0.05
#: After submission the worker's thread is freed and the server's watcher follows the prompt
#: (websocket, with /history as the fallback); off: the worker polls until the prompt ends.
DEFAULT_WATCH = True
#: The watcher asks /history for one watched prompt per server at most this often while its
#: websocket is down (and every ``watch_recheck_seconds`` per prompt while it is up).
DEFAULT_WATCH_POLL_SECONDS = 1.0
DEFAULT_WATCH_RECHECK_SECONDS = 30.0
#: The watcher writes at most one progress point per job this often (docs/api.md "Progress events"):
#: the newest waits in memory, the first goes out at once; 0 writes every new point.
DEFAULT_PROGRESS_INTERVAL_SECONDS = 1.0
#: An unreachable server is probed (GET /system_stats) this often until it answers.
DEFAULT_PROBE_SECONDS = 5.0
#: How often the watcher reads again what its server can run (node classes, model files).
DEFAULT_OFFERS_REFRESH_SECONDS = 300.0
#: Retry backoff: sleep = uniform(0, min(cap, base * 2**(attempt - 1))), or Retry-After if larger.
DEFAULT_RETRY_BASE_SECONDS = 1.0
DEFAULT_RETRY_CAP_SECONDS = 60.0
#: A retry is not scheduled when the job's deadline leaves less than this after the wait.
DEFAULT_MIN_ATTEMPT_SECONDS = 1.0
#: Shared retry budget per provider (token bucket): capacity, cost of a retry, refund per success.
DEFAULT_RETRY_BUDGET_TOKENS = 100
DEFAULT_RETRY_COST_TOKENS = 5
DEFAULT_RETRY_REFUND_TOKENS = 1
#: How often a reconciling job asks the provider again while the provider is still working.
DEFAULT_RECONCILE_INTERVAL_SECONDS = 5.0
#: "No record of the operation, same provider epoch" proves non-execution only once the
#: submission is this old: a request still in transit (a timed-out POST) may land later. The
#: bytes leave at most half a lease (15 s) plus the connect timeout (10 s) after the mark, so
#: the proof assumes the provider enqueues what it received within the rest of this.
DEFAULT_SUBMIT_SETTLE_SECONDS = 60.0
#: A job still reconciling after this long (the provider keeps failing to answer, or lost
#: its outputs) goes to needs_review instead of asking forever.
DEFAULT_RECONCILE_MAX_SECONDS = 2 * 3600
#: A needs_review job nobody resolves is failed and settled as charged after this long.
DEFAULT_REVIEW_EXPIRY_SECONDS = 7 * 24 * 3600
#: Finished jobs (record, attempts, events, output records) are kept this long, then purged.
DEFAULT_RETENTION_SECONDS = 7 * 24 * 3600
#: An attempt whose outcome cannot be known may be retried automatically only when the
#: possible duplicate cost (its uncertain units) is at most this; 0 sends it to review.
DEFAULT_DUPLICATE_COST_ALLOWANCE = 0
#: An event stream (SSE) ends after this long and the client resumes with Last-Event-ID: a
#: stream holds one of gunicorn's few threads, and ending under its graceful_timeout (20 s)
#: lets a restart drain every stream.
DEFAULT_SSE_MAX_SECONDS = 15.0
#: Event streams one web process serves at once (half its default 4 threads); more get 503.
DEFAULT_SSE_MAX_STREAMS = 2
#: The streams process (api/streams/, docs/api.md "Event streams"): open event streams one process serves at
#: once (more get 503; each costs a coroutine and a few kB), and the comment line sent on a stream that had
#: nothing else to send for this long (keeps proxies from closing it, and finds a client gone).
DEFAULT_STREAMS_MAX_STREAMS = 10_000
DEFAULT_STREAMS_PING_SECONDS = 15.0
#: Webhooks (docs/webhooks.md): one request's whole time; how long a delivery is retried (from its first
#: try); the first and the largest delay between tries (doubling, with jitter); requests at once per
#: endpoint, per tenant (its share of the threads: a tenant's slow or hanging endpoints hold at most this
#: many, so it takes threads / tenant share such tenants to keep another's waiting) and in all; redirects
#: followed (each target checked like the first); how long a rotated secret still signs.
DEFAULT_WEBHOOK_TIMEOUT_SECONDS = 10.0
DEFAULT_WEBHOOK_RETRY_WINDOW_SECONDS = 24 * 3600.0
DEFAULT_WEBHOOK_RETRY_FIRST_SECONDS = 5.0
DEFAULT_WEBHOOK_RETRY_MAX_SECONDS = 3600.0
DEFAULT_WEBHOOK_ENDPOINT_CONCURRENCY = 4
DEFAULT_WEBHOOK_TENANT_CONCURRENCY = 4
DEFAULT_WEBHOOK_THREADS = 16
DEFAULT_WEBHOOK_MAX_REDIRECTS = 0
DEFAULT_WEBHOOK_SECRET_OVERLAP_SECONDS = 24 * 3600
#: Admission defaults, each overridable at run time with ``reckon admission set`` (hash
#: ``reckon:{s<n>}:admission`` of every shard): queued jobs per workload class beyond which admission answers 503...
DEFAULT_QUEUE_CAP_INTERACTIVE = 1000
DEFAULT_QUEUE_CAP_BATCH = 10000
#: ...and how long the oldest eligible interactive job may wait before batch work is shed (503).
DEFAULT_INTERACTIVE_TARGET_SECONDS = 60
#: Longest a queued batch job waits behind interactive ones: past it, batch goes first, fairly among tenants.
DEFAULT_BATCH_MAX_WAIT_SECONDS = 600
#: Redis Sentinel (docs/failover.md): ``host:port,...`` and the master's name. When set,
#: state and broker default to ``redis+sentinel://<sentinels>/<master>/0`` and ``.../1``.
DEFAULT_SENTINELS = ""
DEFAULT_SENTINEL_MASTER = "mymaster"
#: Redis Cluster for the state store (``host:port,...`` of startup nodes); empty: RECKON_REDIS_URL.
DEFAULT_REDIS_CLUSTER = ""
#: A write that must not be lost (admission, settlement, output records) is acknowledged only
#: once this many replicas have it (``WAIT``); 0: no WAIT (a single server).
DEFAULT_REPLICAS_TO_ACK = 0
#: How long such a write waits for its replicas (ms) before it is answered as not durable.
DEFAULT_ACK_TIMEOUT_MS = 1000
#: Bearer token for the operator pages (``GET /ui``); empty: those pages answer 401 to everyone.
DEFAULT_OPERATOR_TOKEN = ""
#: Shards the state is split into (docs/failover.md "Redis Cluster"): fixed for a deployment's lifetime.
DEFAULT_SHARDS = 1
#: A durable write's WAIT must end well inside the 10 s socket timeout (pipeline/state/redisconn.py):
#: cut by it, redis-py would send the script again and the client would read "nothing changed".
MAX_ACK_TIMEOUT_MS = 5000


@dataclass(frozen=True)
class Settings:
    redis_url: str = DEFAULT_REDIS_URL
    broker_url: str = DEFAULT_BROKER_URL
    provider_url: str = DEFAULT_PROVIDER_URL
    providers: str = DEFAULT_PROVIDERS
    provider_cap: int = DEFAULT_PROVIDER_CAP
    blob_dir: str = DEFAULT_BLOB_DIR
    blob_url: str = DEFAULT_BLOB_URL
    blob_sync: str = DEFAULT_BLOB_SYNC
    s3_endpoint: str = DEFAULT_S3_ENDPOINT
    price_per_output: int = DEFAULT_PRICE_PER_OUTPUT
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    deadline_grace_seconds: float = DEFAULT_DEADLINE_GRACE_SECONDS
    stall_seconds: float = DEFAULT_STALL_SECONDS
    output_fetch_seconds: float = DEFAULT_OUTPUT_FETCH_SECONDS
    output_uncleaned_types: frozenset[str] = DEFAULT_OUTPUT_UNCLEANED_TYPES
    idempotency_ttl_seconds: int = DEFAULT_IDEMPOTENCY_TTL_SECONDS
    auth_cache_seconds: float = DEFAULT_AUTH_CACHE_SECONDS
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_workflow_bytes: int = DEFAULT_MAX_WORKFLOW_BYTES
    default_deadline_seconds: int = DEFAULT_DEADLINE_SECONDS
    max_seconds_interactive: int = DEFAULT_MAX_SECONDS_INTERACTIVE
    max_seconds_batch: int = DEFAULT_MAX_SECONDS_BATCH
    input_max_bytes: int = DEFAULT_INPUT_MAX_BYTES
    input_quota_bytes: int = DEFAULT_INPUT_QUOTA_BYTES
    input_max_count: int = DEFAULT_INPUT_MAX_COUNT
    input_retention_seconds: int = DEFAULT_INPUT_RETENTION_SECONDS
    outbox_grace_seconds: float = DEFAULT_OUTBOX_GRACE_SECONDS
    sweep_interval_seconds: float = DEFAULT_SWEEP_INTERVAL_SECONDS
    sweep_hold_seconds: float = DEFAULT_SWEEP_HOLD_SECONDS
    poll_interval_seconds: float = DEFAULT_POLL_INTERVAL_SECONDS
    watch: bool = DEFAULT_WATCH
    watch_poll_seconds: float = DEFAULT_WATCH_POLL_SECONDS
    watch_recheck_seconds: float = DEFAULT_WATCH_RECHECK_SECONDS
    progress_interval_seconds: float = DEFAULT_PROGRESS_INTERVAL_SECONDS
    probe_seconds: float = DEFAULT_PROBE_SECONDS
    offers_refresh_seconds: float = DEFAULT_OFFERS_REFRESH_SECONDS
    retry_base_seconds: float = DEFAULT_RETRY_BASE_SECONDS
    retry_cap_seconds: float = DEFAULT_RETRY_CAP_SECONDS
    min_attempt_seconds: float = DEFAULT_MIN_ATTEMPT_SECONDS
    retry_budget_tokens: int = DEFAULT_RETRY_BUDGET_TOKENS
    retry_cost_tokens: int = DEFAULT_RETRY_COST_TOKENS
    retry_refund_tokens: int = DEFAULT_RETRY_REFUND_TOKENS
    reconcile_interval_seconds: float = DEFAULT_RECONCILE_INTERVAL_SECONDS
    reconcile_max_seconds: float = DEFAULT_RECONCILE_MAX_SECONDS
    submit_settle_seconds: float = DEFAULT_SUBMIT_SETTLE_SECONDS
    review_expiry_seconds: int = DEFAULT_REVIEW_EXPIRY_SECONDS
    duplicate_cost_allowance: int = DEFAULT_DUPLICATE_COST_ALLOWANCE
    retention_seconds: int = DEFAULT_RETENTION_SECONDS
    sse_max_seconds: float = DEFAULT_SSE_MAX_SECONDS
    sse_max_streams: int = DEFAULT_SSE_MAX_STREAMS
    streams_max_streams: int = DEFAULT_STREAMS_MAX_STREAMS
    streams_ping_seconds: float = DEFAULT_STREAMS_PING_SECONDS
    webhook_allow_private: bool = False
    webhook_timeout_seconds: float = DEFAULT_WEBHOOK_TIMEOUT_SECONDS
    webhook_retry_window_seconds: float = DEFAULT_WEBHOOK_RETRY_WINDOW_SECONDS
    webhook_retry_first_seconds: float = DEFAULT_WEBHOOK_RETRY_FIRST_SECONDS
    webhook_retry_max_seconds: float = DEFAULT_WEBHOOK_RETRY_MAX_SECONDS
    webhook_endpoint_concurrency: int = DEFAULT_WEBHOOK_ENDPOINT_CONCURRENCY
    webhook_tenant_concurrency: int = DEFAULT_WEBHOOK_TENANT_CONCURRENCY
    webhook_threads: int = DEFAULT_WEBHOOK_THREADS
    webhook_max_redirects: int = DEFAULT_WEBHOOK_MAX_REDIRECTS
    webhook_secret_overlap_seconds: int = DEFAULT_WEBHOOK_SECRET_OVERLAP_SECONDS
    queue_cap_interactive: int = DEFAULT_QUEUE_CAP_INTERACTIVE
    queue_cap_batch: int = DEFAULT_QUEUE_CAP_BATCH
    interactive_target_seconds: int = DEFAULT_INTERACTIVE_TARGET_SECONDS
    batch_max_wait_seconds: int = DEFAULT_BATCH_MAX_WAIT_SECONDS
    operator_token: str = field(default=DEFAULT_OPERATOR_TOKEN, repr=False)
    shards: int = DEFAULT_SHARDS
    sentinels: str = DEFAULT_SENTINELS
    sentinel_master: str = DEFAULT_SENTINEL_MASTER
    redis_cluster: str = DEFAULT_REDIS_CLUSTER
    replicas_to_ack: int = DEFAULT_REPLICAS_TO_ACK
    ack_timeout_ms: int = DEFAULT_ACK_TIMEOUT_MS

    def __post_init__(self) -> None:
        if self.retention_seconds < self.idempotency_ttl_seconds:
            # a replay rebuilds the first response from the job: the job must outlive its key
            raise ValueError("RECKON_RETENTION_SECONDS must be at least RECKON_IDEMPOTENCY_TTL_SECONDS")
        if self.shards < 1:
            raise ValueError("RECKON_SHARDS must be at least 1")
        if not 0 <= self.auth_cache_seconds <= MAX_AUTH_CACHE_SECONDS:  # a revoked key must stop working soon
            raise ValueError(f"RECKON_AUTH_CACHE_SECONDS must be between 0 and {MAX_AUTH_CACHE_SECONDS:g}")
        if self.idempotency_ttl_seconds < 1:  # the record is written with its expiry (SET ... EX)
            raise ValueError("RECKON_IDEMPOTENCY_TTL_SECONDS must be at least 1")
        if not 0 < self.ack_timeout_ms <= MAX_ACK_TIMEOUT_MS:  # a WAIT cut by the socket timeout is sent again
            raise ValueError(f"RECKON_ACK_TIMEOUT_MS must be between 1 and {MAX_ACK_TIMEOUT_MS}")
        if self.stall_seconds <= self.output_fetch_seconds + STEP_AFTER_FETCH_SECONDS:
            # a slow but legal fetch, then its blob put and record, would be given up
            raise ValueError(f"RECKON_STALL_SECONDS must be more than RECKON_OUTPUT_FETCH_SECONDS + "
                             f"{STEP_AFTER_FETCH_SECONDS:.0f}")
        if not self.progress_interval_seconds >= 0:  # also refuses NaN
            raise ValueError("RECKON_PROGRESS_INTERVAL_SECONDS must be 0 or more")
        if not (0 < self.webhook_timeout_seconds and 0 < self.webhook_retry_first_seconds
                <= self.webhook_retry_max_seconds and self.webhook_endpoint_concurrency >= 1
                and self.webhook_tenant_concurrency >= 1
                and self.webhook_threads >= 1 and self.webhook_max_redirects >= 0):
            raise ValueError("RECKON_WEBHOOK_*: timeouts and delays above 0 (first at most max), concurrency "
                             "and threads at least 1, redirects 0 or more")
        if self.sweep_hold_seconds <= 0:  # a hold of 0 would hand every due tenant to every sweeper
            raise ValueError("RECKON_SWEEP_HOLD_SECONDS must be more than 0")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Build settings from ``RECKON_*`` variables; unset ones keep their defaults."""
        env = os.environ if env is None else env
        fields: dict[str, tuple[str, Callable[[str], Any]]] = {
            "redis_url": ("RECKON_REDIS_URL", str),
            "broker_url": ("RECKON_BROKER_URL", str),
            "provider_url": ("RECKON_PROVIDER_URL", str),
            "providers": ("RECKON_PROVIDERS", str),
            "provider_cap": ("RECKON_PROVIDER_CAP", int),
            "blob_dir": ("RECKON_BLOB_DIR", str),
            "blob_url": ("RECKON_BLOB_URL", str),
            "blob_sync": ("RECKON_BLOB_SYNC", blob_sync),
            "s3_endpoint": ("RECKON_S3_ENDPOINT", str),
            "price_per_output": ("RECKON_PRICE_PER_OUTPUT", int),
            "max_attempts": ("RECKON_MAX_ATTEMPTS", int),
            "lease_seconds": ("RECKON_LEASE_SECONDS", float),
            "deadline_grace_seconds": ("RECKON_DEADLINE_GRACE_SECONDS", float),
            "stall_seconds": ("RECKON_STALL_SECONDS", float),
            "output_fetch_seconds": ("RECKON_OUTPUT_FETCH_SECONDS", float),
            "output_uncleaned_types": ("RECKON_OUTPUT_UNCLEANED_TYPES", content_types),
            "idempotency_ttl_seconds": ("RECKON_IDEMPOTENCY_TTL_SECONDS", int),
            "auth_cache_seconds": ("RECKON_AUTH_CACHE_SECONDS", float),
            "max_body_bytes": ("RECKON_MAX_BODY_BYTES", int),
            "max_workflow_bytes": ("RECKON_MAX_WORKFLOW_BYTES", int),
            "default_deadline_seconds": ("RECKON_DEFAULT_DEADLINE_SECONDS", int),
            "max_seconds_interactive": ("RECKON_MAX_SECONDS_INTERACTIVE", int),
            "max_seconds_batch": ("RECKON_MAX_SECONDS_BATCH", int),
            "input_max_bytes": ("RECKON_INPUT_MAX_BYTES", int),
            "input_quota_bytes": ("RECKON_INPUT_QUOTA_BYTES", int),
            "input_max_count": ("RECKON_INPUT_MAX_COUNT", int),
            "input_retention_seconds": ("RECKON_INPUT_RETENTION_SECONDS", int),
            "outbox_grace_seconds": ("RECKON_OUTBOX_GRACE_SECONDS", float),
            "sweep_interval_seconds": ("RECKON_SWEEP_INTERVAL_SECONDS", float),
            "sweep_hold_seconds": ("RECKON_SWEEP_HOLD_SECONDS", float),
            "poll_interval_seconds": ("RECKON_POLL_INTERVAL_SECONDS", float),
            "watch": ("RECKON_WATCH", flag),
            "watch_poll_seconds": ("RECKON_WATCH_POLL_SECONDS", float),
            "watch_recheck_seconds": ("RECKON_WATCH_RECHECK_SECONDS", float),
            "progress_interval_seconds": ("RECKON_PROGRESS_INTERVAL_SECONDS", float),
            "probe_seconds": ("RECKON_PROBE_SECONDS", float),
            "offers_refresh_seconds": ("RECKON_OFFERS_REFRESH_SECONDS", float),
            "retry_base_seconds": ("RECKON_RETRY_BASE_SECONDS", float),
            "retry_cap_seconds": ("RECKON_RETRY_CAP_SECONDS", float),
            "min_attempt_seconds": ("RECKON_MIN_ATTEMPT_SECONDS", float),
            "retry_budget_tokens": ("RECKON_RETRY_BUDGET_TOKENS", int),
            "retry_cost_tokens": ("RECKON_RETRY_COST_TOKENS", int),
            "retry_refund_tokens": ("RECKON_RETRY_REFUND_TOKENS", int),
            "reconcile_interval_seconds": ("RECKON_RECONCILE_INTERVAL_SECONDS", float),
            "reconcile_max_seconds": ("RECKON_RECONCILE_MAX_SECONDS", float),
            "submit_settle_seconds": ("RECKON_SUBMIT_SETTLE_SECONDS", float),
            "review_expiry_seconds": ("RECKON_REVIEW_EXPIRY_SECONDS", int),
            "duplicate_cost_allowance": ("RECKON_DUPLICATE_COST_ALLOWANCE", int),
            "retention_seconds": ("RECKON_RETENTION_SECONDS", int),
            "sse_max_seconds": ("RECKON_SSE_MAX_SECONDS", float),
            "sse_max_streams": ("RECKON_SSE_MAX_STREAMS", int),
            "streams_max_streams": ("RECKON_STREAMS_MAX_STREAMS", int),
            "streams_ping_seconds": ("RECKON_STREAMS_PING_SECONDS", float),
            "webhook_allow_private": ("RECKON_WEBHOOK_ALLOW_PRIVATE", flag),
            "webhook_timeout_seconds": ("RECKON_WEBHOOK_TIMEOUT_SECONDS", float),
            "webhook_retry_window_seconds": ("RECKON_WEBHOOK_RETRY_WINDOW_SECONDS", float),
            "webhook_retry_first_seconds": ("RECKON_WEBHOOK_RETRY_FIRST_SECONDS", float),
            "webhook_retry_max_seconds": ("RECKON_WEBHOOK_RETRY_MAX_SECONDS", float),
            "webhook_endpoint_concurrency": ("RECKON_WEBHOOK_ENDPOINT_CONCURRENCY", int),
            "webhook_tenant_concurrency": ("RECKON_WEBHOOK_TENANT_CONCURRENCY", int),
            "webhook_threads": ("RECKON_WEBHOOK_THREADS", int),
            "webhook_max_redirects": ("RECKON_WEBHOOK_MAX_REDIRECTS", int),
            "webhook_secret_overlap_seconds": ("RECKON_WEBHOOK_SECRET_OVERLAP_SECONDS", int),
            "queue_cap_interactive": ("RECKON_QUEUE_CAP_INTERACTIVE", int),
            "queue_cap_batch": ("RECKON_QUEUE_CAP_BATCH", int),
            "interactive_target_seconds": ("RECKON_INTERACTIVE_TARGET_SECONDS", int),
            "batch_max_wait_seconds": ("RECKON_BATCH_MAX_WAIT_SECONDS", int),
            "operator_token": ("RECKON_OPERATOR_TOKEN", str),
            "shards": ("RECKON_SHARDS", int),
            "sentinels": ("RECKON_SENTINELS", str),
            "sentinel_master": ("RECKON_SENTINEL_MASTER", str),
            "redis_cluster": ("RECKON_REDIS_CLUSTER", str),
            "replicas_to_ack": ("RECKON_REPLICAS_TO_ACK", int),
            "ack_timeout_ms": ("RECKON_ACK_TIMEOUT_MS", int),
        }
        values = {name: parse(env[var]) for name, (var, parse) in fields.items() if var in env}
        if env.get("RECKON_SENTINELS") and "RECKON_REDIS_URL" not in env:
            master = values.get("sentinel_master", DEFAULT_SENTINEL_MASTER)
            values["redis_url"] = f"redis+sentinel://{values['sentinels']}/{master}/0"
        if "redis_url" in values and "RECKON_BROKER_URL" not in env:
            values["broker_url"] = with_db(values["redis_url"], 1)
        return cls(**values)

    def servers(self) -> list[Server]:
        return parse_servers(self.providers, default_url=self.provider_url, cap=self.provider_cap,
                             price=self.price_per_output)

    def caps(self) -> dict[str, int]:
        """Server name -> dispatch cap, for the processes that unpark or report without a fleet."""
        return {server.name: server.cap for server in self.servers()}


def blob_sync(value: str) -> str:
    if value not in ("group", "file"):
        raise ValueError(f"RECKON_BLOB_SYNC: group or file, not {value!r}")
    return value


def flag(value: str) -> bool:
    """A boolean variable: 1/true/yes/on or 0/false/no/off."""
    lowered = value.strip().lower()
    if lowered not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        raise ValueError(f"not a boolean: {value!r}")
    return lowered in ("1", "true", "yes", "on")


def with_db(url: str, db: int) -> str:
    """The same server URL pointing at logical database ``db`` (a Sentinel URL keeps its master name)."""
    parts = urlsplit(url)
    if parts.scheme == "redis+sentinel":
        master = parts.path.strip("/").split("/")[0]
        return parts._replace(path=f"/{master}/{db}").geturl()
    return parts._replace(path=f"/{db}").geturl()
