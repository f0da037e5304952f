"""Lifecycle stages."""
