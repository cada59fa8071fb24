"""Providers: the interface reckon needs, a ComfyUI adapter, and a simulated ComfyUI."""
