"""HTML reports: render, write and rebuild the self-contained results page."""

from kerascope.report.features import add_feature_grid, feature_grid
from kerascope.report.html import ReportEntry, html_table, read_report_data, render, write_report
from kerascope.report.rebuild import load_explanations, rebuild_report

__all__ = ["ReportEntry", "add_feature_grid", "feature_grid", "html_table", "load_explanations", "read_report_data",
           "rebuild_report", "render", "write_report"]
