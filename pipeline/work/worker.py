"""The worker process: Dramatiq's CLI with JSON logs from its main process as well as its workers.

``python -m pipeline.work.worker pipeline.work.actors --processes 2 --threads 4`` takes the arguments of
``dramatiq``. Under plain ``dramatiq`` the worker processes log JSON (importing ``pipeline.work.actors``
replaces the CLI's format) but the main process, which never imports them, keeps the CLI's plain
format ("Dramatiq '2.2.1' is booting up.", "Sending signal ..."); here the root logger is set before
the CLI starts and the CLI is told to leave it alone (``--skip-logging``).
"""

from __future__ import annotations

import sys

from dramatiq import cli

from pipeline.logs import configure
from pipeline.state.redisconn import name_connections


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    configure("worker")
    name_connections("worker")
    check_shards()
    args = cli.make_argument_parser().parse_args(argv)
    args.skip_logging = True
    # On SIGHUP Dramatiq stops its workers and re-executes sys.argv: make that this module again.
    sys.argv = [sys.executable, "-m", "pipeline.work.worker", *argv]
    return int(cli.main(args) or 0)


def check_shards() -> None:
    """Refuse to start with another shard count than the state holds (``Store.check_shards``): a
    worker that started would fail every message it takes. Redis not answering yet is no reason to
    stop: each worker process checks again before its first job."""
    import redis
    from redis.exceptions import RedisClusterException

    from pipeline.settings import Settings
    from pipeline.state.store import open_store

    try:
        open_store(Settings.from_env()).redis.close()
    except (redis.ConnectionError, redis.TimeoutError, RedisClusterException):
        pass


if __name__ == "__main__":
    sys.exit(main())
