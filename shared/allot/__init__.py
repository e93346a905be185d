"""Allot: a control plane for shared GPU clusters."""

from allot import compiled_core

compiled_core.use()  # the mypyc-compiled core when a current build exists (tools/build_core.py)
