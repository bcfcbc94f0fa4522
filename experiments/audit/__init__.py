"""Audits of the test suite itself: deliberate one-line mutations of the code, each run against the tests that
should catch it."""
