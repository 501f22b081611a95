"""Cluster simulator (in progress)."""
