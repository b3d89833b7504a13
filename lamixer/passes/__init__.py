"""Passes over the IR: verify, rewrite (normalize reads), classify, plan."""
