"""``python -m pipeline.providers.sim``: one simulated ComfyUI on a loopback port."""

from pipeline.providers.sim.server import main

main()
