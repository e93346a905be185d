"""Allot: a control plane for shared GPU clusters."""
