"""The machinery every subject stands on: one QEMU machine, its command
line and warm start, SSH and the console, the probe and the environment,
the KVM ioctls, the measurement record and its statistics, figures and the
page templates, and the base images/ uses (errors, paths, locks, leftovers,
settings, poll).  Imports no subject, no judging, no report."""
