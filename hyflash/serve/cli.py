"""`hyflash serve`: load the engine as `generate` does, then serve it over HTTP with uvicorn."""

from __future__ import annotations

import signal
import sys
import threading

from hyflash.flags import MODEL_HELP, add_engine_args, target_options
from hyflash.errors import HyflashError

# Seconds uvicorn waits, after SIGTERM or Ctrl-C, for requests in flight to finish before cancelling them.
SHUTDOWN_GRACE_S = 30


def add_cli(subparsers) -> None:
    p = subparsers.add_parser("serve", help="an OpenAI-compatible HTTP server (chat and text completions, "
                                            "streamed or not) with lossless speculative decoding")
    p.add_argument("--model", default="smollm2-135m", help=MODEL_HELP)
    p.add_argument("--drafter", default="default", help="none | ngram | default | PATH to a drafter folder")
    add_engine_args(p)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 opens it to the "
                        "network, without authentication)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--queue-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="a request waiting longer than this for the engine gets 503 (default 60)")
    p.set_defaults(handler=cmd_serve)


def cmd_serve(args) -> int:
    if not 0 <= args.port <= 65535:
        raise HyflashError(f"--port must be in 0..65535, got {args.port}")
    if not args.queue_timeout > 0:
        raise HyflashError(f"--queue-timeout must be > 0 seconds, got {args.queue_timeout}")
    import logging

    import uvicorn

    from hyflash import engine
    from hyflash.serve.app import ServeConfig, create_app
    from hyflash.serve.metrics import ServerMetrics
    from hyflash.serve.worker import EngineWorker

    target, drafter, policy, choice = engine.load(args.model, args.dtype, args.drafter, args.adaptive, args.tree,
                                                  backend=args.backend, keep_drafter=args.keep_drafter,
                                                  target_options=target_options(args))
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    metrics = ServerMetrics()
    worker = EngineWorker(target, drafter, policy, on_finish=metrics.finished, in_thread=False)
    app = create_app(worker, ServeConfig(args.model, args.queue_timeout, choice.dtype), metrics)
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port,
                                           timeout_graceful_shutdown=SHUTDOWN_GRACE_S, log_level="info"))
    print(f"hyflash serve: {args.model} ({choice.dtype}, drafter {args.drafter}) on http://{args.host}:{args.port}/v1",
          file=sys.stderr, flush=True)
    return serve_on_main_thread(server, worker)


def serve_on_main_thread(server, worker) -> int:
    """HTTP in a second thread, the engine on this one (where torch decodes fastest; see serve/worker.py).

    uvicorn installs signal handlers only on the main thread, so this thread routes SIGINT/SIGTERM to it: it
    stops accepting, lets requests in flight finish (up to SHUTDOWN_GRACE_S), and its lifespan shutdown stops
    the engine, which ends `worker.run`. If the HTTP thread ends for any other reason (the port is taken), the
    engine is stopped too, so the process never outlives its server.
    """

    def serve_http() -> None:
        try:
            server.run()
        finally:
            worker.stop()

    previous = {sig: signal.signal(sig, server.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
    http = threading.Thread(target=serve_http, name="hyflash-http", daemon=True)
    try:
        http.start()
        worker.run()
        http.join()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not server.started:
        raise HyflashError(f"the server did not start on {server.config.host}:{server.config.port} (see the log "
                           f"above: a port in use? pick another with --port)")
    return 0
