"""Reports: what a tune and a comparison show people.

- summary.py: the tune's progress bar and closing summary (TuneProgress, print_summary);
- regret.py: compare's definitions (per-device winners, cross-device regret, portable choices);
- outputs.py (terminal, CSV, JSON), html.py (the Plotly report), browser.py (rendering it to check
  it), console.py (terminal vs log-file output), studies.py (a report's study by name).
"""

from zhantune.report.summary import TuneProgress, print_summary

__all__ = ["TuneProgress", "print_summary"]
