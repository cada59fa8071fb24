"""gunicorn settings for reckon's API (the ``web`` process)."""

import os

bind = f"127.0.0.1:{os.environ.get('PORT', '8000')}"
workers = int(os.environ.get("RECKON_WEB_WORKERS", "2"))
worker_class = "gthread"
threads = int(os.environ.get("RECKON_WEB_THREADS", "4"))
timeout = 30
graceful_timeout = 20
# No access log: request paths name jobs and output locations, which stay out of logs.
accesslog = None
errorlog = "-"
# gunicorn >= 25.1 opens a control socket for gunicornc at one default path per user
# ($XDG_RUNTIME_DIR/gunicorn.ctl or ~/.gunicorn/gunicorn.ctl), shared by every gunicorn on the
# machine: a second stack would take over the first one's. reckon does not use it. (Older
# versions ignore this setting.)
control_socket_disable = True
