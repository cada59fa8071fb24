"""What operators run: the ``reckon`` command line (``cli``) and the text it prints (``report``).

Imports anything below it (ground, ``state``, ``blobs``, ``providers``, ``work``); only the API
sits above.
"""
