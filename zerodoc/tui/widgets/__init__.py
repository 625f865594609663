"""Widgets of the TUI: one module per view, styles kept beside each widget."""
