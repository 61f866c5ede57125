"""The `angpt` subcommands: each module exposes `add_arguments(parser)` and `run(args) -> int` and is a thin
layer over the library (every capability is callable from Python without the CLI)."""
