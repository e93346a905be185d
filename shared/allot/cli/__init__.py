"""The `allot` command."""
