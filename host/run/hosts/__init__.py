"""Many lab hosts: one ``memqual run`` spread over a fleet through Avocado's
remote spawner (docs/hosts.md).

Why it is built so: docs/architecture.md, "Module notes", host/run/hosts/__init__.py.
"""
