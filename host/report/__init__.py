"""What people read: report.html, comparison, history and the terminal
tables, and the KCIDB export.  Imports no subject: a subject's section
comes from the ``memqual.report_sections`` entry points.  Judges nothing."""
