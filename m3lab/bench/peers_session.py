"""Alias of ``python -m m3lab.sessions.peers`` (the GPU session stands above the runners, in m3lab/sessions/):
``python -m m3lab.bench.peers_session --out DIR --phases ...`` runs that module as a script, so this runner room
imports nothing above it."""
import runpy

if __name__ == "__main__":
    runpy.run_module("m3lab.sessions.peers", run_name="__main__", alter_sys=True)
