"""`roboloop serve`: a model folder or registry reference behind the policy server (`roboloop.serving`)."""

from __future__ import annotations

import argparse
import logging
import sys


def add_parser(sub) -> None:
    s = sub.add_parser("serve", help="serve a policy to robots and simulators over websocket + msgpack (token "
                       "required; follows the registry when REF is an alias such as registry:NAME@champion)")
    s.add_argument("ref", help="a model folder, registry:NAME@champion (followed: a promotion is loaded, checked "
                   "and swapped in) or registry:NAME@3 (pinned)")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    s.add_argument("--port", type=int, default=8765, help="port (0: any free one; printed on start)")
    s.add_argument("--device", default="cpu", help="torch device for the model")
    s.add_argument("--seed", type=int, default=0, help="the model's noise seed (flow-matching sampling)")
    s.add_argument("--max-batch", type=int, default=64, help="observations in one forward pass (1: no batching)")
    s.add_argument("--max-wait-ms", type=float, default=2.0, help="how long a request waits for others to batch "
                   "with")
    s.add_argument("--follow-interval", type=float, default=2.0, help="seconds between looks at the registry alias")
    s.add_argument("--token-file", help="the token file (default $ROBOLOOP_SERVE_TOKEN_FILE or "
                   ".roboloop/serve-token; created with mode 600 when absent)")
    s.set_defaults(fn=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    from roboloop.serving.server import ServeConfig, Server
    from roboloop.serving.token import read_token, token_path

    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"roboloop serve: binding {args.host}: anyone who reaches it and holds the token drives the robot; "
              "put TLS in front (wss://) off a trusted network", file=sys.stderr)
    token = read_token(args.token_file, create=True)
    logging.getLogger("roboloop.serve").setLevel(logging.INFO)
    server = Server(ServeConfig(args.ref, args.host, args.port, args.device, args.seed, args.max_batch,
                                args.max_wait_ms, follow_interval_s=args.follow_interval), token)
    spec = server.service.slot.spec()
    print(f"roboloop serve: {spec['version']} ({spec['state_dim']}-dim state, cameras {spec['camera_keys']}, "
          f"chunks of {spec['horizon']}x{spec['action_dim']}); token in {token_path(args.token_file)}"
          + (f"; following {server.follow[1]}@{server.follow[2]}" if server.follow else ""), file=sys.stderr,
          flush=True)
    server.start()
    print(f"roboloop serve: listening on ws://{args.host}:{server.port}", file=sys.stderr, flush=True)
    try:
        assert server.thread is not None
        server.thread.join()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0
