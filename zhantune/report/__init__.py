"""Reports: terminal progress and summaries."""

from zhantune.report.summary import TuneProgress, print_summary

__all__ = ["TuneProgress", "print_summary"]
