"""Serving a policy to robots: a websocket + msgpack policy server (`roboloop serve`), its clients and the wire
format (no pickle anywhere on the network path: `tests/unit/serving/test_no_pickle.py` checks)."""
