"""`angpt serve`: an OpenAI-compatible server over a checkpoint, built on transformers' own server.

server.py starts transformers' server with the model and its one-line refusals, guard.py is the ASGI middleware in
front of it (keys, body and time limits, concurrency), requests.py checks each request's fields before the model's
worker sees it (docs/tools.md, "angpt serve facing clients"). May import the model files, inference/ and
dependencies/; nothing outside imports it but the `serve` command.
"""
