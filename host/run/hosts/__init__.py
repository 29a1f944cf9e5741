"""Many lab hosts: one ``memqual run`` spread over a fleet through Avocado's
remote spawner (docs/hosts.md).

config.py    the hosts file (TOML, one ``[[host]]`` table a host) -> LabHost
ssh.py       the one way memqual reaches a lab host: key-based OpenSSH, host key pinned
probe.py     what a lab host says about itself (``memqual hosts probe``, run there)
check.py     ``memqual hosts check``: reachable, same memqual, QEMU and KVM, free
spawner.py   the Avocado spawner plugin: Avocado's remote spawner, with each task's
             records fetched back and a lost host's tasks accounted for
fleet.py     ``memqual run --hosts``: one Avocado job over every host, per-host results
page.py      the fleet page: every claim's verdict on every host, the odd ones marked
cli.py       ``memqual hosts check|probe``
"""
