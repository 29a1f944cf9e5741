"""The commands: one module per command, each a ``Command`` (command.py)
listed once in commands.py; main.py is the ``memqual`` entry point; the
``python -m`` tools (supervisor, testsummary, bench_boot, memslots_bench)
are entry points here too.  The only room that uses argparse."""
