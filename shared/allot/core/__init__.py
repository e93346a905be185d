"""The pure scheduling core: standard library only, no I/O, no wall clock (time is an argument)."""
