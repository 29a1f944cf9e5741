"""The lab's tools: one-off ``python -m memqual.lab.NAME`` commands that
reproduced the figures docs/ quotes (block spreads of A/A runs, boot-fault
counts, boot timings, the controls' power, a clock's repeatability).  No
``memqual`` command, e2e test or script runs them, so they stay out of the
product: they import host/ and images/, nothing there imports them (the
import contract lab-outside-the-product), and the wheel leaves them out.
docs/lab.md says what each is for and its command."""
