"""What this project takes from other projects beyond their public API: the ledger of private and internal names the
code touches, with why and the versions each was checked with (ledger.py; docs/usage.md, "Supported versions").
Imports nothing of the package.
"""
