"""Prefect flows: ingest, convert, train, evaluate, register and the closed loop that chains them."""
