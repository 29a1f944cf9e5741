"""memqual: end-to-end qualification of memory virtualization on QEMU/KVM.

One import name for the whole suite.  The code lives in the folders the
design card names at the top of the repository (host/, images/, e2e/, the
lab's tools in lab/, with guest/ and claims/ beside them as data); the links
in this folder put them under ``memqual`` so that an installed memqual adds
one name to site-packages, not generic ones like ``host`` that collide with
other distributions'.  A checkout and an editable install import through the
links (src/ alone on sys.path); a wheel holds real copies, lab/ left out
(pyproject.toml)."""
