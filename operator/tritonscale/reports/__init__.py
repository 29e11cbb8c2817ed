"""Presentation: the HTML load-test report and the dashboard preview."""
