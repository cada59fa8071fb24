"""What one job may cost in Redis on the deployed path: the budget ``tests/faults/test_budget.py``
enforces and ``make bench`` reports against (README "What one job costs").

Measured by ops/deployed.py: the Procfile's processes with default settings, two simulated ComfyUI
servers, jobs posted over HTTP, 2 outputs each, progress on. A change that makes a job cost more
raises the figure here in the same commit, and says why in its message.
"""

#: Redis commands per job (``INFO commandstats`` delta over both databases, ``info`` left out), at most.
COMMANDS_PER_JOB = 230

#: Commands per job of each step of a job's own path, at most (ops/deployed.py ``STEPS``). These
#: are the scripts' own counts and the same for every job of a run; the rest of the total is the
#: broker's, the watcher's and the sweeper's share, which depends on how long the processes idle.
STEPS = {
    "admission": 22,
    "claim": 18,
    "submit mark": 7,
    "hand-over": 5,
    "progress": 28,  # 7 a point, at most 4 points (the simulated server's steps)
    "collect": 6,  # 5, and 2 for each duplicate collect message (a prompt's end seen twice)
    "outputs": 10,
    "charge": 3,
    "finish": 21,
    "confirm-publish": 6,
}
