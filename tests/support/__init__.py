"""Helpers the tests share: fixtures, stand-in servers, drills, templates (not tests)."""
