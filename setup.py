"""What the wheel holds; the project's metadata is in pyproject.toml.

The code's packages are found as they are added.  The folders the code
reads at run time but are not Python (guest/: the agents' C sources, the
guest's init files and the balloon driver patch; claims/: claims.json) ship
as package data under ``memqual/``: as top-level names of their own, "guest"
and "claims" would collide with other distributions' in site-packages.
``host.paths.shipped`` finds them there, or beside host/ in a checkout.
pyproject.toml cannot list found packages and mapped ones together, hence
this file."""

from setuptools import find_packages, setup

SHIPPED = {"memqual.guest": "guest", "memqual.claims": "claims"}

setup(
    packages=[*find_packages(include=["host*", "images*", "e2e*"]), *SHIPPED],
    package_dir=SHIPPED,
    package_data={
        "memqual.guest": ["*.c", "*.h", "*.sh", "*.patch", "inittab"],
        "memqual.claims": ["*.json"],
        "host.memslots": ["layouts/*.json"],
    },
)
