"""Prefect tasks: thin adapters over `roboloop` (retries, cache keys, artifacts, logging)."""
