"""roboloop: a reproducible closed loop for robot foundation policies."""

__version__ = "0.1.0"
