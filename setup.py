"""What the wheel holds; the project's metadata is in pyproject.toml.

Everything installs under the one name ``memqual``: the design card's
folders (host/, images/, e2e/) are linked into memqual/ and found there, so
site-packages gets ``memqual.host``, not a top-level ``host`` that would
collide with other distributions'.  The folders the code reads at run time
that are not Python (guest/: the agents' C sources, the guest's init files
and the balloon driver patch; claims/: claims.json) ship as package data
beside them, where ``memqual.host.paths.shipped`` finds them; the pages'
templates and style sheet (host/templates/) ship inside memqual.host, where
``memqual.host.pages`` loads them.
pyproject.toml cannot list found packages and data folders together, hence
this file."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["memqual", "memqual.*"]), "memqual.guest", "memqual.claims"],
    package_data={
        "memqual.guest": ["*.c", "*.h", "*.sh", "*.patch", "inittab"],
        "memqual.claims": ["*.json"],
        "memqual.host": ["*.schema.json", "templates/*.j2", "templates/*.css"],
        "memqual.host.memslots": ["layouts/*.json"],
    },
)
