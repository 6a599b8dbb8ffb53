"""hypermedia: a self-hostable media processing service built on durable jobs."""

__version__ = "0.1.0"
