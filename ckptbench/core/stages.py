"""The stages of a restore, in order: the one place their names are defined."""

LIST, READ, VERIFY, LOAD, DEVICE, CHECK = "list", "read", "verify", "load", "device", "check"
STAGES = (LIST, READ, VERIFY, LOAD, DEVICE, CHECK)
