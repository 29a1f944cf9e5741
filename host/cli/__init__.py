"""The commands: one module per command, each a ``Command`` (command.py)
listed once in commands.py; main.py is the ``memqual`` entry point; the
``python -m`` tools the product runs (supervisor, testsummary, calibrate)
are entry points here too.  The only room of host/ that uses argparse; the
lab's one-off tools are in lab/ (docs/lab.md)."""
