"""Worked examples a user can copy or name in a config (``objective: rankkit.examples.losses.NAME``)."""
