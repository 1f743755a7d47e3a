"""HTML reports: render, write and rebuild the self-contained results page."""

from kerascope.report.html import ReportEntry, html_table, read_report_data, render, write_report
from kerascope.report.rebuild import load_explanations, rebuild_report

__all__ = ["ReportEntry", "html_table", "load_explanations", "read_report_data", "rebuild_report", "render",
           "write_report"]
