"""What operators run: the ``reckon`` command line, its parser (``cli``), its commands
(``commands``), the text ``reckon status`` prints (``report``) and the commands to run next for a job
(``advice``: the operators' job page shows them), and money after the fact (``money``: adjust, export,
reconcile; ``invoice``: a provider's statement against the books).

Imports anything below it (ground, ``state``, ``blobs``, ``providers``, ``work``); only the API
sits above.
"""
