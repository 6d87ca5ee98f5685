"""`hyflash serve`: an OpenAI-compatible HTTP server over the speculative decoding engine.

worker.py owns the engine (one generation at a time, FIFO queue, streaming, stop strings, cancellation),
schemas.py the OpenAI request models and error objects, app.py the FastAPI routes and server-sent events,
metrics.py the Prometheus counters, cli.py the `serve` command.
"""
