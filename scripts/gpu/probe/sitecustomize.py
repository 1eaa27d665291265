"""Installs scripts/gpu/t3_queue_probe.py in a process started with this directory on its path,
when CHORUS_PROBE_OUT names where to write (a diagnostic; see that file)."""
import os

if os.environ.get("CHORUS_PROBE_OUT"):
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import t3_queue_probe

    t3_queue_probe.install(os.environ["CHORUS_PROBE_OUT"])
