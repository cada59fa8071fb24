"""What operators run: the ``reckon`` command line, its parser (``cli``), its commands
(``commands``) and the text ``reckon status`` prints (``report``).

Imports anything below it (ground, ``state``, ``blobs``, ``providers``, ``work``); only the API
sits above.
"""
