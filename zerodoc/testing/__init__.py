"""Helpers for testing zerodoc and for the benches: hostile inputs (`hostile`)."""
