"""Providers: the interface reckon needs (``base``), the ComfyUI adapter (``comfyui``, its answers,
``http``, ``media`` with ``containers`` and ``frames``), a provider that runs nothing (``null``), the adapters of one process's servers
(``fleet``) and a simulated ComfyUI (``sim``). Imports only the ground (``pipeline.errors``,
``pipeline.settings``, ``pipeline.fleet``; the simulator ``pipeline.logs``): a provider knows nothing of Redis.
"""
