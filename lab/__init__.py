"""The lab's tools: one-off ``python -m memqual.lab.NAME`` commands that
measured what docs/ quotes (A/A block spreads, the controls' power, boot
timings and faults, a clock's repeatability, the memslot model's speed) or
rendered its pages again.  No ``memqual`` command, e2e test or script runs
them, so they stay out of the product: they import host/ and images/,
nothing there imports them (the import contract lab-outside-the-product),
and the wheel leaves them out.  docs/lab.md says what each is for."""
