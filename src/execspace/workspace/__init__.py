"""Workspaces: layout, confined file access, metadata, staging."""
